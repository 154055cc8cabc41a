"""GET /v1/jobs/{id}/logs: a rank's output as the agent wrote it, with the job routes' tenant
rule, rank and attempt selection, the last lines, and following a running rank to its end.

The rank output is written by the agent's own launcher (services/agent/ranks.py) into a work
directory that a real agent log server (services/agent/log_server.py) serves; the API reads it
only through that server.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI

from gangway.launcher import free_port
from schemas.jobs import JobAdmitted, JobFailed, JobRequeued, JobSucceeded, TaskStarted
from services.agent import logs
from services.agent.ranks import RankKey, launch
from services.api.app import create_app
from services.runtime import EventStore, Settings
from tests.api.builders import reserved
from tests.api.conftest import ADMIN_TOKEN, Api, api_settings

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}

pytestmark = pytest.mark.integration


async def run_rank(root: Path, job_id: str, attempt: int, rank: int, script: str) -> None:
    """Run a real rank process, as the agent does, to its end."""
    workdir = logs.rank_log(root, job_id, attempt, rank).path.parent
    placement = reserved(job_id, [("n1", [rank])]).ranks[0]
    process = await launch(
        RankKey(job_id, attempt, rank), placement, 2, [sys.executable, "-c", script], {}, workdir
    )
    assert await process.process.wait() == 0


async def seen_running(client: httpx.AsyncClient, job_id: str) -> None:
    """A real server learns of events written behind its back by polling the log: wait until
    it has seen the job's ranks start (where they run says which agent holds their logs)."""
    async with asyncio.timeout(30):
        while True:
            job = (await client.get(f"/v1/jobs/{job_id}", headers=ADMIN)).json()
            if job.get("state") == "running":
                return
            await asyncio.sleep(0.05)


async def started_job(api: Api, store: EventStore, team: str = "nlp") -> str:
    headers = api.teams.get(team) or await api.create_team(team)
    job_id = await api.submit(headers, team=team, tasks=2, gpus_per_task=1)
    await store.append(
        f"job-{job_id}",
        1,
        [
            JobAdmitted(job_id=job_id, queue=team, priority="research"),
            reserved(job_id, [("n1", [0]), ("n1", [1])]),
            TaskStarted(job_id=job_id, attempt=1, rank=0, node_id="n1"),
            TaskStarted(job_id=job_id, attempt=1, rank=1, node_id="n1"),
        ],
    )
    await seen_running(api.client, job_id)
    return job_id


async def test_a_ranks_output_whole_by_rank_and_by_attempt(
    api: Api, store: EventStore, tmp_path: Path
) -> None:
    job_id = await started_job(api, store)
    root = tmp_path / "agent"
    await run_rank(
        root, job_id, 1, 0, "import sys; print('hi', flush=True); print('oops', file=sys.stderr)"
    )
    await run_rank(root, job_id, 1, 1, "print('rank one says hi')")
    headers = api.teams["nlp"]

    whole = await api.client.get(f"/v1/jobs/{job_id}/logs", headers=headers)
    assert whole.status_code == 200, whole.text
    assert whole.headers["content-type"].startswith("text/plain")
    assert whole.text == "hi\noops\n"  # stdout and stderr, in the order written
    assert (whole.headers["x-gangway-attempt"], whole.headers["x-gangway-rank"]) == ("1", "0")

    one = await api.client.get(f"/v1/jobs/{job_id}/logs", params={"rank": 1}, headers=headers)
    assert one.text == "rank one says hi\n"
    missing = await api.client.get(
        f"/v1/jobs/{job_id}/logs", params={"rank": 1, "attempt": 2}, headers=headers
    )
    assert missing.status_code == 404
    assert missing.headers["content-type"] == "application/problem+json"

    # The first attempt failed; the second starts rank 1 on another node.
    await store.append(
        f"job-{job_id}",
        5,
        [
            JobRequeued(job_id=job_id, attempt=1, code="task_failed", reason="rank 0 failed"),
            reserved(job_id, [("n2", [0]), ("n2", [1])], attempt=2),
            TaskStarted(job_id=job_id, attempt=2, rank=1, node_id="n2"),
        ],
    )
    await run_rank(root, job_id, 2, 1, "print('second attempt')")
    async with asyncio.timeout(30):  # until the API has seen where attempt 2's rank 1 started
        while True:
            second = await api.client.get(
                f"/v1/jobs/{job_id}/logs", params={"rank": 1, "attempt": 2}, headers=headers
            )
            if second.status_code != 404:
                break
            await asyncio.sleep(0.05)
    assert second.text == "second attempt\n"


async def test_the_last_lines(api: Api, store: EventStore, tmp_path: Path) -> None:
    job_id = await started_job(api, store)
    await run_rank(tmp_path / "agent", job_id, 1, 0, "for i in range(5000): print(f'line {i}')")
    url = f"/v1/jobs/{job_id}/logs"
    last = await api.client.get(url, params={"tail": 3}, headers=api.as_admin())
    assert last.text == "line 4997\nline 4998\nline 4999\n"
    none = await api.client.get(url, params={"tail": 0}, headers=api.as_admin())
    assert none.text == ""
    more = await api.client.get(url, params={"tail": 100_000}, headers=api.as_admin())
    assert more.text.count("\n") == 5000


async def test_another_team_gets_404_and_bad_selections_get_422(
    api: Api, store: EventStore, tmp_path: Path
) -> None:
    job_id = await started_job(api, store, team="nlp")
    await run_rank(tmp_path / "agent", job_id, 1, 0, "print('private to nlp')")
    vision = await api.create_team("vision")
    other = await api.client.get(f"/v1/jobs/{job_id}/logs", headers=vision)
    assert other.status_code == 404
    assert "private" not in other.text
    nobody = await api.client.get(f"/v1/jobs/{job_id}/logs")
    assert nobody.status_code == 401
    for params in ({"rank": -1}, {"attempt": 0}, {"tail": "x"}):
        bad = await api.client.get(f"/v1/jobs/{job_id}/logs", params=params, headers=vision)
        assert bad.status_code == 422, params
    ghost = await api.client.get("/v1/jobs/nope/logs", headers=api.as_admin())
    assert ghost.status_code == 404


async def test_a_rank_or_attempt_the_job_does_not_have_is_named_as_such(
    api: Api, store: EventStore
) -> None:
    # A newcomer's `gangway logs JOB --rank 5` on a two-rank job read "output of rank 5 …
    # not found", as if the output were lost.
    job_id = await started_job(api, store)
    response = await api.client.get(
        f"/v1/jobs/{job_id}/logs", params={"rank": 5}, headers=api.teams["nlp"]
    )
    assert response.status_code == 404
    assert response.json()["detail"] == f"job {job_id} has no rank 5: its ranks are 0 … 1"
    later = await api.client.get(
        f"/v1/jobs/{job_id}/logs", params={"attempt": 5}, headers=api.teams["nlp"]
    )
    assert later.status_code == 404
    assert later.json()["detail"] == f"job {job_id} has no attempt 5: it has had 1 attempt"


async def test_a_rank_that_never_wrote_of_an_ended_job_says_why_it_ended(
    api: Api, store: EventStore
) -> None:
    # A launch that failed (no such program) leaves no output: the 404 said only "not found".
    job_id = await started_job(api, store)
    reason = "launch failed on n1 rank 0: no such program: trian"
    await store.append(f"job-{job_id}", 5, [JobFailed(job_id=job_id, attempt=1, reason=reason)])
    async with asyncio.timeout(30):
        while True:
            job = (await api.client.get(f"/v1/jobs/{job_id}", headers=ADMIN)).json()
            if job["state"] == "failed":
                break
            await asyncio.sleep(0.05)
    response = await api.client.get(f"/v1/jobs/{job_id}/logs", headers=api.teams["nlp"])
    assert response.status_code == 404
    assert response.json()["detail"] == (
        f"output of rank 0 of attempt 1 of job {job_id} not found (the job is failed: {reason})"
    )


async def test_a_job_that_has_not_started_has_no_output_yet(api: Api) -> None:
    headers = await api.create_team("nlp")
    job_id = await api.submit(headers, tasks=1, gpus_per_task=1)
    response = await api.client.get(f"/v1/jobs/{job_id}/logs", headers=headers)
    assert response.status_code == 404
    assert "not started" in response.json()["detail"]


async def test_follow_streams_what_the_rank_writes_until_the_job_ends(
    api_url: str, store: EventStore, tmp_path: Path
) -> None:
    # A real server: an ASGI transport would hand over the body only once it is complete.
    async with httpx.AsyncClient(base_url=api_url, headers=ADMIN) as client:
        job_id = await started_job(
            Api(client, FastAPI(), api_settings(Settings(), tmp_path)), store
        )
        path = logs.rank_log(tmp_path / "agent", job_id, 1, 0).path
        path.parent.mkdir(parents=True)
        path.write_text("before\n")
        received: list[str] = []
        arrived = asyncio.Event()

        async def until(text: str) -> None:
            while "".join(received) != text:
                arrived.clear()
                await arrived.wait()

        async def follow() -> None:
            async with client.stream(
                "GET", f"/v1/jobs/{job_id}/logs", params={"follow": "true"}
            ) as response:
                assert response.status_code == 200
                async for text in response.aiter_text():
                    received.append(text)
                    arrived.set()

        reader = asyncio.create_task(follow())
        async with asyncio.timeout(30):
            await until("before\n")
            with path.open("a") as handle:
                handle.write("after\n")
            await until("before\nafter\n")
            assert not reader.done()  # still running: the stream stays open
            with path.open("a") as handle:
                handle.write("last words\n")
            await store.append(f"job-{job_id}", 5, [JobSucceeded(job_id=job_id, attempt=1)])
            await reader  # the job's end ends the stream, after everything it wrote
        assert "".join(received) == "before\nafter\nlast words\n"


async def test_a_rank_cannot_make_the_api_read_outside_its_logs(
    api: Api, store: EventStore, tmp_path: Path
) -> None:
    """A rank writes in the very directories the API reads: a symlink it leaves there (to the
    control plane's files, or another team's) is not followed, and a FIFO it leaves there
    does not hang the reader; both are simply no output."""
    secret = tmp_path / "control-plane.secret"
    secret.write_text("admin-token-of-the-control-plane\n")
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "rank.log").write_text("admin-token-of-the-control-plane\n")
    job_id = await started_job(api, store)
    script = (
        "import os\n"
        "os.remove('rank.log')\n"
        f"os.symlink({str(secret)!r}, 'rank.log')\n"
        f"os.symlink({str(outside)!r}, '../rank-1')\n"
        "os.mkdir('../rank-2')\n"
        "os.mkfifo('../rank-2/rank.log')\n"
    )
    await run_rank(tmp_path / "agent", job_id, 1, 0, script)
    url = f"/v1/jobs/{job_id}/logs"
    async with asyncio.timeout(30):
        for params in ({"rank": 0}, {"rank": 1}, {"rank": 1, "tail": 1}, {"rank": 2}):
            response = await api.client.get(url, params=params, headers=api.teams["nlp"])
            assert response.status_code == 404, (params, response.text)
            assert response.headers["content-type"] == "application/problem+json"
            assert "admin-token" not in response.text


async def test_following_ends_when_the_token_is_revoked(
    api_url: str, store: EventStore, tmp_path: Path
) -> None:
    async with httpx.AsyncClient(base_url=api_url, headers=ADMIN, timeout=30) as client:
        job_id = await started_job(
            Api(client, FastAPI(), api_settings(Settings(), tmp_path)), store
        )
        issued = (await client.post("/v1/teams/nlp/tokens", json={"name": "laptop"})).json()
        laptop = {"Authorization": f"Bearer {issued['token']}"}
        path = logs.rank_log(tmp_path / "agent", job_id, 1, 0).path
        path.parent.mkdir(parents=True)
        path.write_text("before\n")
        async with (
            asyncio.timeout(30),
            client.stream(
                "GET", f"/v1/jobs/{job_id}/logs", params={"follow": "true"}, headers=laptop
            ) as response,
        ):
            assert response.status_code == 200
            chunks = response.aiter_text()
            received = await anext(chunks)
            assert received == "before\n"
            revoked = await client.delete(f"/v1/teams/nlp/tokens/{issued['id']}")
            assert revoked.status_code == 204, revoked.text
            with path.open("a") as handle:
                handle.write("after the revocation\n")
            # The job runs on; the stream ends all the same, before the new line.
            async for text in chunks:
                received += text
        assert received == "before\n"


async def test_an_agent_that_does_not_answer_is_a_503_problem(
    settings: Settings, store: EventStore, tmp_path: Path
) -> None:
    unreachable = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    configured = api_settings(settings, tmp_path, agent_logs_url=unreachable)
    app = create_app(configured, use_bus=False)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://gangway.test", headers=ADMIN
        ) as client,
    ):
        job_id = await started_job(Api(client, app, configured), store)
        response = await client.get(f"/v1/jobs/{job_id}/logs")
        assert response.status_code == 503
        assert response.headers["content-type"] == "application/problem+json"
