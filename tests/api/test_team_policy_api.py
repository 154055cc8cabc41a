"""A team's policy, set by the admin: classes it may use, non-preemptible jobs, pending and rate
caps (403 and 429 problems), recorded as events in the log."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from schemas.jobs import JobCancelled
from schemas.teams import TeamPolicyConfigured
from services.api.app import create_app
from services.runtime import EventStore, Settings
from tests.api.conftest import Api, api_settings, serving

pytestmark = pytest.mark.integration

JOB = {"name": "train", "team": "nlp", "tasks": 1, "gpus_per_task": 1}


async def set_policy(api: Api, **policy: object) -> dict[str, object]:
    response = await api.client.put("/v1/teams/nlp/policy", json=policy, headers=api.as_admin())
    assert response.status_code == 200, response.text
    body: dict[str, object] = response.json()
    return body


async def test_a_new_team_may_use_every_class_but_inference_critical(api: Api) -> None:
    nlp = await api.create_team("nlp")
    policy = (await api.client.get("/v1/teams/nlp/policy", headers=nlp)).json()
    assert policy["allowed_priority_classes"] == ["best-effort", "production", "research"]
    assert policy["non_preemptible_allowed"] is False
    critical = await api.client.post(
        "/v1/jobs", json={**JOB, "priority": "inference-critical"}, headers=nlp
    )
    assert critical.status_code == 403, critical.text
    assert critical.json()["type"] == "https://gangway.dev/problems/priority-not-allowed"
    pinned = await api.client.post("/v1/jobs", json={**JOB, "preemptible": False}, headers=nlp)
    assert pinned.status_code == 403, pinned.text
    assert pinned.json()["type"] == "https://gangway.dev/problems/non-preemptible-not-allowed"


async def test_ten_years_of_min_runtime_is_a_non_preemptible_job(
    api: Api, store: EventStore
) -> None:
    """A gang shielded by min_runtime_s for ten years was accepted (201) and could not be
    preempted to give a lender its guarantee back: a non-preemptible job without the grant."""
    nlp = await api.create_team("nlp")
    before = await store.head()
    for extra in ({}, {"max_runtime_s": 3e8}):
        shielded = await api.client.post(
            "/v1/jobs", json={**JOB, "min_runtime_s": 3e8, **extra}, headers=nlp
        )
        assert shielded.status_code == 403, shielded.text
        problem = shielded.json()
        assert problem["type"] == "https://gangway.dev/problems/non-preemptible-not-allowed"
        assert "min_runtime_s" in problem["detail"]
    assert await store.head() == before
    await set_policy(api, non_preemptible_allowed=True)
    granted = await api.client.post("/v1/jobs", json={**JOB, "min_runtime_s": 3e8}, headers=nlp)
    assert granted.status_code == 201, granted.text


async def test_the_admin_grants_inference_critical_and_non_preemptible_jobs(
    api: Api, store: EventStore
) -> None:
    nlp = await api.create_team("nlp")
    await set_policy(
        api,
        allowed_priority_classes=["inference-critical", "production"],
        non_preemptible_allowed=True,
    )
    body = {**JOB, "priority": "inference-critical", "preemptible": False}
    response = await api.client.post("/v1/jobs", json=body, headers=nlp)
    assert response.status_code == 201, response.text
    # ... and research, not in the list any more, is refused.
    research = await api.client.post("/v1/jobs", json=JOB, headers=nlp)
    assert research.status_code == 403
    [recorded] = [
        e.payload for e in await store.read_stream("team-nlp") if e.type == "TeamPolicyConfigured"
    ]
    assert recorded == TeamPolicyConfigured(
        team="nlp",
        allowed_priority_classes=["inference-critical", "production"],
        non_preemptible_allowed=True,
    )


async def test_only_the_admin_sets_a_policy(api: Api) -> None:
    nlp = await api.create_team("nlp")
    response = await api.client.put(
        "/v1/teams/nlp/policy",
        json={"allowed_priority_classes": ["inference-critical"]},
        headers=nlp,
    )
    assert response.status_code == 403


async def test_a_policy_naming_an_unknown_class_is_refused(api: Api) -> None:
    await api.create_team("nlp")
    response = await api.client.put(
        "/v1/teams/nlp/policy", json={"allowed_priority_classes": ["vip"]}, headers=api.as_admin()
    )
    assert response.status_code == 422


async def test_a_team_at_its_pending_cap_gets_429_with_retry_after(api: Api) -> None:
    nlp = await api.create_team("nlp")
    await set_policy(api, max_pending_jobs=2)
    for _ in range(2):
        assert (await api.client.post("/v1/jobs", json=JOB, headers=nlp)).status_code == 201
    response = await api.client.post("/v1/jobs", json=JOB, headers=nlp)
    assert response.status_code == 429, response.text
    assert response.headers["content-type"] == "application/problem+json"
    assert response.json()["type"] == "https://gangway.dev/problems/too-many-pending"
    assert int(response.headers["retry-after"]) >= 1
    # Another team is not held to nlp's cap.
    vision = await api.create_team("vision")
    other = await api.client.post("/v1/jobs", json={**JOB, "team": "vision"}, headers=vision)
    assert other.status_code == 201


async def test_a_team_past_its_submission_rate_gets_429_with_retry_after(api: Api) -> None:
    nlp = await api.create_team("nlp")
    # One submission an hour: the first passes, the second cannot, whatever the test's speed.
    await set_policy(api, submissions_per_second=1 / 3600)
    assert (await api.client.post("/v1/jobs", json=JOB, headers=nlp)).status_code == 201
    response = await api.client.post("/v1/jobs", json=JOB, headers=nlp)
    assert response.status_code == 429, response.text
    assert response.json()["type"] == "https://gangway.dev/problems/rate-limited"
    assert 1 <= int(response.headers["retry-after"]) <= 3600


async def test_the_rate_counts_submissions_a_batch_being_one(api: Api) -> None:
    """`submissions_per_second` limits requests; `max_pending_jobs` bounds the jobs they add."""
    nlp = await api.create_team("nlp")
    await set_policy(api, submissions_per_second=1 / 3600)
    batch = await api.client.post("/v1/jobs:batch", json={"jobs": [JOB] * 3}, headers=nlp)
    assert batch.status_code == 201, batch.text
    assert len(batch.json()["jobs"]) == 3
    response = await api.client.post("/v1/jobs", json=JOB, headers=nlp)
    assert response.status_code == 429, response.text
    assert "submissions per second (a batch or an array is one" in response.json()["detail"]


@contextlib.asynccontextmanager
async def another_worker(api: Api) -> AsyncIterator[httpx.AsyncClient]:
    """A second API process's app on the same database (as `--workers 2` runs it): nothing
    in memory shared with the first."""
    app = create_app(api.settings.model_copy(update={"api_worker": 2}), use_bus=False)
    async with serving(app) as client:
        yield client


async def test_a_teams_submission_rate_holds_across_api_workers(api: Api) -> None:
    nlp = await api.create_team("nlp")
    vision = await api.create_team("vision")
    for team in ("nlp", "vision"):
        response = await api.client.put(
            f"/v1/teams/{team}/policy",
            json={"submissions_per_second": 1 / 3600},
            headers=api.as_admin(),
        )
        assert response.status_code == 200, response.text
    async with another_worker(api) as second:
        assert (await api.client.post("/v1/jobs", json=JOB, headers=nlp)).status_code == 201
        # The other worker holds the team to the same bucket: no second submission this hour.
        response = await second.post("/v1/jobs", json=JOB, headers=nlp)
        assert response.status_code == 429, response.text
        assert response.json()["type"] == "https://gangway.dev/problems/rate-limited"
        batch = await second.post("/v1/jobs:batch", json={"jobs": [JOB, JOB]}, headers=nlp)
        assert batch.status_code == 429, batch.text
        # Another team has a bucket of its own.
        other = await second.post("/v1/jobs", json={**JOB, "team": "vision"}, headers=vision)
        assert other.status_code == 201, other.text


async def test_concurrent_submissions_over_two_workers_share_one_burst(api: Api) -> None:
    nlp = await api.create_team("nlp")
    # A burst of one and no refill to speak of: of six submissions racing over two workers,
    # exactly one passes.
    await set_policy(api, submissions_per_second=1 / 3600)
    async with another_worker(api) as second:
        answers = await asyncio.gather(
            *(
                (api.client if i % 2 else second).post("/v1/jobs", json=JOB, headers=nlp)
                for i in range(6)
            )
        )
    statuses = sorted(response.status_code for response in answers)
    assert statuses == [201, 429, 429, 429, 429, 429], [r.text for r in answers]


async def test_a_team_reads_its_own_policy_but_not_anothers(api: Api) -> None:
    nlp = await api.create_team("nlp")
    await api.create_team("vision")
    assert (await api.client.get("/v1/teams/nlp/policy", headers=nlp)).status_code == 200
    assert (await api.client.get("/v1/teams/vision/policy", headers=nlp)).status_code == 403


async def test_a_team_under_its_pending_cap_in_the_log_is_not_refused_by_a_stale_count(
    settings: Settings, store: EventStore, tmp_path: Path
) -> None:
    """Found by the hardening run (2026-11-23 evening): a worker counted a team's pending jobs
    from its own fold, so a job that left the queue (cancelled through another worker, placed
    or ended by the scheduler) a moment ago still counted, and the team was refused (429) under
    its cap. A refusal is now decided at the log's head. This worker's log poll is an hour
    apart and it reads no bus: only the submission itself can see the cancel."""
    app = create_app(api_settings(settings, tmp_path, catch_up_interval_s=3600), use_bus=False)
    async with serving(app) as client:
        api = Api(client, app, api_settings(settings, tmp_path))
        nlp = await api.create_team("nlp")
        await set_policy(api, max_pending_jobs=1)
        first = await client.post("/v1/jobs", json=JOB, headers=nlp)
        assert first.status_code == 201, first.text
        job_id = first.json()["id"]
        # The scheduler (another process) records the cancel a client asked another worker for.
        await store.append(f"job-{job_id}", 1, [JobCancelled(job_id=job_id, reason="by test")])
        second = await client.post("/v1/jobs", json=JOB, headers=nlp)
        assert second.status_code == 201, second.text
        third = await client.post("/v1/jobs", json=JOB, headers=nlp)
        assert third.status_code == 429, third.text  # the cap still holds


async def test_a_patch_cannot_raise_a_class_the_policy_took_away_through_another_worker(
    settings: Settings, store: EventStore, tmp_path: Path
) -> None:
    """A class changed by PATCH is judged by the API alone (admission judged the submitted
    spec): a worker that had not folded the admin's new policy, written through another
    worker, let a team raise its waiting job to a class it may no longer use (200). This
    worker polls the log an hour apart and reads no bus: only the PATCH itself can see it."""
    app = create_app(api_settings(settings, tmp_path, catch_up_interval_s=3600), use_bus=False)
    async with serving(app) as client:
        api = Api(client, app, api_settings(settings, tmp_path))
        nlp = await api.create_team("nlp")
        submitted = await client.post(
            "/v1/jobs", json={**JOB, "priority": "research", "hold": True}, headers=nlp
        )
        assert submitted.status_code == 201, submitted.text
        job_id = submitted.json()["id"]
        restricted = TeamPolicyConfigured(team="nlp", allowed_priority_classes=["research"])
        await store.append(restricted.stream, None, [restricted])
        head = await store.head()
        raised = await client.patch(
            f"/v1/jobs/{job_id}", json={"priority": "production"}, headers=nlp
        )
        assert raised.status_code == 403, raised.text
        assert raised.json()["type"] == "https://gangway.dev/problems/priority-not-allowed"
        assert await store.head() == head


async def test_submissions_at_once_never_pass_the_pending_cap(api: Api) -> None:
    """Requests checked at once each saw the same pending count: 60 held submissions sent
    together against a cap of 5 all landed (attack9)."""
    nlp = await api.create_team("nlp")
    await set_policy(api, max_pending_jobs=5, submissions_per_second=1000)
    held = {**JOB, "hold": True}
    answers = await asyncio.gather(
        *(api.client.post("/v1/jobs", json=held, headers=nlp) for _ in range(20)),
        *(
            api.client.post("/v1/jobs", json={**held, "array": {"count": 2}}, headers=nlp)
            for _ in range(5)
        ),
    )
    assert all(answer.status_code in (201, 429) for answer in answers), [
        answer.text for answer in answers
    ]
    policy = await api.client.get("/v1/teams/nlp/policy", headers=api.as_admin())
    assert 1 <= policy.json()["pending_jobs"] <= 5
