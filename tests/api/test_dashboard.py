"""The web dashboard: the snapshot it draws (what each caller may see), the page and its files,
and the live stream that redraws it without a reload."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from schemas.jobs import JobAdmitted, TaskStarted
from schemas.nodes import GpuUnhealthy
from schemas.telemetry import GpuSample, NodeHeartbeat
from services.api.activity import GpuActivity
from services.api.app import create_app
from services.api.auth import Principal
from services.api.observability import ObservabilityCollector
from services.api.projections.dashboard import snapshot
from services.api.projections.model import ReadModels
from services.runtime import EventStore, Settings
from services.runtime.consumer import publish_telemetry
from services.runtime.kafka import make_producer
from services.runtime.topics import Topics, ensure_topics
from tests.api.builders import Log, node, reserved, submitted
from tests.api.conftest import ADMIN_TOKEN, Api, api_settings

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def two_teams() -> ReadModels:
    models = ReadModels()
    models.apply_all(
        Log().record(
            node("n1", rack="r1", block="b1"),
            node("n2", rack="r2", block="b1"),
            GpuUnhealthy(node_id="n2", gpu_index=7, reason="xid 79"),
            submitted("nlp-run", "nlp", tasks=1, gpus_per_task=2),
            JobAdmitted(job_id="nlp-run", queue="nlp", priority="research"),
            reserved("nlp-run", [("n1", [0, 1])]),
            TaskStarted(job_id="nlp-run", attempt=1, rank=0, node_id="n1"),
            submitted("vision-run", "vision", tasks=1, gpus_per_task=4),
            JobAdmitted(job_id="vision-run", queue="vision", priority="production"),
            reserved("vision-run", [("n1", [2, 3, 4, 5])]),
            submitted("nlp-wait", "nlp", tasks=4, gpus_per_task=8),
            submitted("vision-wait", "vision", tasks=1, gpus_per_task=1),
        )
    )
    return models


def gpu_states(view: dict[str, Any]) -> dict[tuple[str, int], dict[str, Any]]:
    cluster = view["cluster"]
    assert isinstance(cluster, dict)
    return {
        (n["id"], g["index"]): g
        for block in cluster["blocks"]
        for rack in block["racks"]
        for n in rack["nodes"]
        for g in n["gpus"]
    }


def test_the_grid_is_blocks_racks_nodes_gpus_with_each_gpus_state() -> None:
    view = snapshot(two_teams(), Principal(team=None))
    [block] = view["cluster"]["blocks"]
    assert block["id"] == "b1" and [r["id"] for r in block["racks"]] == ["r1", "r2"]
    gpus = gpu_states(view)
    assert gpus[("n1", 0)] == {
        "index": 0,
        "state": "allocated",
        "job": "nlp-run",
        "team": "nlp",
        "utilization": None,  # no telemetry given
    }
    assert gpus[("n1", 2)]["job"] == "vision-run"
    assert gpus[("n1", 6)]["state"] == "free"
    assert gpus[("n2", 7)]["state"] == "unhealthy"
    assert [j["id"] for j in view["queue"]["running"]] == ["vision-run", "nlp-run"]
    assert {j["id"] for j in view["queue"]["waiting"]} == {"nlp-wait", "vision-wait"}


def test_a_team_sees_its_own_jobs_and_only_that_others_gpus_are_taken() -> None:
    view = snapshot(two_teams(), Principal(team="nlp"))
    gpus = gpu_states(view)
    assert gpus[("n1", 0)]["job"] == "nlp-run"
    assert gpus[("n1", 2)] == {
        "index": 2,
        "state": "allocated",
        "job": None,
        "team": None,
        "utilization": None,
    }
    assert [j["id"] for j in view["queue"]["running"]] == ["nlp-run"]
    assert [j["id"] for j in view["queue"]["waiting"]] == ["nlp-wait"]
    assert "vision" not in json.dumps(view)
    assert view["viewer"] == "nlp"


async def test_the_page_and_its_files_need_no_token_and_hold_no_data(api: Api) -> None:
    page = await api.client.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert '<script src="/ui/app.js">' in page.text
    script = await api.client.get("/ui/app.js")
    assert script.status_code == 200 and "/v1/dashboard/stream" in script.text
    assert (await api.client.get("/ui/style.css")).status_code == 200
    for path in ("/ui/index.html", "/ui/..%2Fapp.py", "/ui/secret"):
        missing = await api.client.get(path)
        assert missing.status_code == 404, path
    # Nothing on the page is fetched from elsewhere: it works without a network.
    for text in (page.text, script.text):
        assert "http://" not in text.replace("http://www.w3.org/2000/svg", "")
        assert "https://" not in text


async def test_the_snapshot_route_needs_a_token_and_keeps_teams_apart(
    api: Api, store: EventStore
) -> None:
    assert (await api.client.get("/v1/dashboard")).status_code == 401
    nlp = await api.create_team("nlp")
    await api.create_team("vision")
    await store.append("node-n1", 0, [node("n1")])
    vision_job = await api.submit(api.teams["vision"], team="vision", tasks=1, gpus_per_task=1)
    mine = await api.submit(nlp, tasks=1, gpus_per_task=1)
    view = (await api.client.get("/v1/dashboard", headers=nlp)).json()
    assert [j["id"] for j in view["queue"]["waiting"]] == [mine]
    assert vision_job not in json.dumps(view)
    everything = (await api.client.get("/v1/dashboard", headers=api.as_admin())).json()
    assert {j["id"] for j in everything["queue"]["waiting"]} == {mine, vision_job}
    async with asyncio.timeout(30):
        while True:  # written as the inventory would: the API reads it a moment later
            view = (await api.client.get("/v1/dashboard", headers=api.as_admin())).json()
            if view["cluster"]["blocks"]:
                break
            await asyncio.sleep(0.05)
    assert len(view["cluster"]["blocks"][0]["racks"][0]["nodes"][0]["gpus"]) == 8


async def snapshots(response: httpx.Response) -> AsyncIterator[dict[str, Any]]:
    """The `snapshot` events of a server-sent event stream, parsed."""
    buffer = ""
    async for text in response.aiter_text():
        buffer += text
        while "\n\n" in buffer:
            block, buffer = buffer.split("\n\n", 1)
            lines = block.split("\n")
            if "event: snapshot" in lines:
                data = "".join(line[6:] for line in lines if line.startswith("data: "))
                yield json.loads(data)


@pytest.mark.integration
async def test_the_stream_redraws_when_a_job_is_submitted_and_starts(
    api_url: str, store: EventStore
) -> None:
    async with httpx.AsyncClient(base_url=api_url, headers=ADMIN, timeout=30) as admin:
        created = await admin.post("/v1/teams", json={"name": "nlp"})
        nlp = {"Authorization": f"Bearer {created.json()['token']}"}
        created = await admin.post("/v1/teams", json={"name": "vision"})
        vision = {"Authorization": f"Bearer {created.json()['token']}"}
        await store.append("node-n1", 0, [node("n1")])
        async with (
            admin.stream(
                "GET", "/v1/dashboard/stream", params={"interval": 0.05}, headers=nlp
            ) as mine,
            admin.stream(
                "GET", "/v1/dashboard/stream", params={"interval": 0.05}, headers=vision
            ) as theirs,
        ):
            assert mine.status_code == 200
            assert mine.headers["content-type"].startswith("text/event-stream")
            seen = snapshots(mine)
            first = await anext(seen)
            assert first["queue"] == {"waiting": [], "running": []}

            spec = {"name": "train", "team": "nlp", "tasks": 1, "gpus_per_task": 2}
            job_id = (await admin.post("/v1/jobs", json=spec, headers=nlp)).json()["id"]
            async with asyncio.timeout(30):
                async for view in seen:
                    if [j["id"] for j in view["queue"]["waiting"]] == [job_id]:
                        break
                await store.append(
                    f"job-{job_id}",
                    1,
                    [
                        JobAdmitted(job_id=job_id, queue="nlp", priority="research"),
                        reserved(job_id, [("n1", [0, 1])]),
                        TaskStarted(job_id=job_id, attempt=1, rank=0, node_id="n1"),
                    ],
                )
                async for view in seen:
                    running = view["queue"]["running"]
                    if running and running[0]["id"] == job_id and running[0]["state"] == "running":
                        break
                assert gpu_states(view)[("n1", 0)]["job"] == job_id
                # The other team's stream shows the GPUs taken, never by what.
                async for view in snapshots(theirs):
                    # (The first snapshots may predate the node's registration.)
                    if gpu_states(view).get(("n1", 0), {}).get("state") == "allocated":
                        break
                assert job_id not in json.dumps(view)


@pytest.mark.integration
async def test_the_stream_of_a_revoked_token_ends_before_it_shows_anything_new(
    api_url: str,
) -> None:
    """A token is checked when the stream opens and again before each snapshot: revoking it
    (a leaked laptop) must not leave a stream open that keeps showing the team's jobs."""
    async with httpx.AsyncClient(base_url=api_url, headers=ADMIN, timeout=30) as admin:
        created = await admin.post("/v1/teams", json={"name": "nlp"})
        nlp = {"Authorization": f"Bearer {created.json()['token']}"}
        issued = (await admin.post("/v1/teams/nlp/tokens", json={"name": "laptop"})).json()
        laptop = {"Authorization": f"Bearer {issued['token']}"}
        async with admin.stream(
            "GET", "/v1/dashboard/stream", params={"interval": 0.05}, headers=laptop
        ) as stream:
            assert stream.status_code == 200
            seen = snapshots(stream)
            await anext(seen)
            revoked = await admin.delete(f"/v1/teams/nlp/tokens/{issued['id']}")
            assert revoked.status_code == 204, revoked.text
            spec = {"name": "secret-project", "team": "nlp", "tasks": 1, "gpus_per_task": 1}
            job_id = (await admin.post("/v1/jobs", json=spec, headers=nlp)).json()["id"]
            async with asyncio.timeout(30):
                async for view in seen:
                    assert job_id not in json.dumps(view)
        # The loop above ends only when the server ends the stream.


async def test_gpu_activity_from_telemetry_colours_the_grid_and_feeds_the_metrics() -> None:
    models = two_teams()
    activity = GpuActivity()
    now = datetime(2026, 11, 21, 13, 0, tzinfo=UTC)
    heartbeat = NodeHeartbeat(
        node_id="n1",
        at=now - timedelta(seconds=5),
        gpus=[
            GpuSample(index=0, utilization=90, sm_activity=60),
            GpuSample(index=1, utilization=10),  # a GPU without GPM: no SM activity
        ],
    )
    await activity.observe(heartbeat)
    # A late redelivery of an older sample changes nothing.
    await activity.observe(
        heartbeat.model_copy(
            update={"at": now - timedelta(minutes=1), "gpus": [GpuSample(index=0, utilization=0)]}
        )
    )
    gpus = gpu_states(snapshot(models, Principal(team=None), now=now, activity=activity))
    assert (gpus[("n1", 0)]["utilization"], gpus[("n1", 1)]["utilization"]) == (0.9, 0.1)
    assert gpus[("n1", 2)]["utilization"] is None  # never reported
    assert activity.utilization("n1", 0, now + timedelta(minutes=5)) is None  # stale

    # The metrics judge freshness by the clock at scrape time: a heartbeat of just now.
    await activity.observe(heartbeat.model_copy(update={"at": datetime.now(UTC)}))
    registry = CollectorRegistry()
    registry.register(ObservabilityCollector(lambda: models, lambda: activity))
    families = {
        (s.name, *sorted(s.labels.items())): s.value
        for f in text_string_to_metric_families(generate_latest(registry).decode())
        for s in f.samples
    }
    nlp = (("gpu_type", "H100"), ("team", "nlp"))
    # nlp's gang holds n1's GPUs 0 and 1: 90% and 10% busy.
    assert families[("gangway_team_gpus_busy", *nlp)] == pytest.approx(1.0)
    assert families[("gangway_team_gpu_utilization_ratio", *nlp)] == pytest.approx(0.5)
    # SM activity (GPM): only GPU 0 reports it, 60% of its SMs busy.
    assert families[("gangway_team_gpus_sm_active", *nlp)] == pytest.approx(0.6)
    assert families[("gangway_team_gpu_sm_active_ratio", *nlp)] == pytest.approx(0.6)
    # vision's GPUs sent nothing: no figure rather than a made-up 0%.
    assert not any(
        key[0] in ("gangway_team_gpus_busy", "gangway_team_gpus_sm_active")
        and ("team", "vision") in key
        for key in families
    )


@pytest.mark.integration
async def test_heartbeats_on_the_bus_reach_the_dashboard(
    settings: Settings, store: EventStore, tmp_path: Path
) -> None:
    await ensure_topics(settings)
    app = create_app(api_settings(settings, tmp_path), use_bus=True)
    producer = make_producer(settings)
    await producer.start()
    try:
        async with (
            app.router.lifespan_context(app),
            httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url="http://t"
            ) as client,
        ):
            await store.append("node-n1", 0, [node("n1")])
            beat = NodeHeartbeat(
                node_id="n1", at=datetime.now(UTC), gpus=[GpuSample(index=3, utilization=75)]
            )
            async with asyncio.timeout(60):
                while True:
                    # Sent again until the API's new consumer group has joined and read it.
                    await publish_telemetry(
                        producer, Topics.from_settings(settings), beat, key=settings.bus_signing_key
                    )
                    view = (await client.get("/v1/dashboard", headers=ADMIN)).json()
                    if gpu_states(view).get(("n1", 3), {}).get("utilization") == 0.75:
                        break
                    await asyncio.sleep(0.2)
    finally:
        await producer.stop()
