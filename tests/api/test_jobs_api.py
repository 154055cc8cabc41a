"""/v1/jobs against the real log: submission, visibility, team isolation, request rules."""

from __future__ import annotations

import asyncio

import pytest

from schemas.jobs import JobAdmitted, JobCancelRequested, JobRejected, JobSubmitted
from services.runtime import EventStore
from tests.api.conftest import Api

pytestmark = pytest.mark.integration


async def eventually_state(api: Api, job_id: str, state: str) -> None:
    async with asyncio.timeout(30):
        while True:
            response = await api.client.get(f"/v1/jobs/{job_id}", headers=api.as_admin())
            if response.json().get("state") == state:
                return
            await asyncio.sleep(0.05)


async def test_submit_answers_201_with_the_id_and_pending_state(api: Api) -> None:
    await api.create_team("nlp")
    response = await api.client.post(
        "/v1/jobs",
        json={"name": "train", "team": "nlp", "tasks": 2, "gpus_per_task": 4},
        headers=api.as_admin(),
    )
    assert response.status_code == 201
    assert response.json() == {"id": response.json()["id"], "state": "pending"}


async def test_a_submitted_job_is_visible_at_once(api: Api) -> None:
    job_id = await api.submit(api.as_admin(), priority="production")
    response = await api.client.get(f"/v1/jobs/{job_id}", headers=api.as_admin())
    assert response.status_code == 200
    job = response.json()
    assert (job["state"], job["team"], job["priority"], job["gpus"]) == (
        "pending",
        "nlp",
        "production",
        8,
    )


async def test_submission_is_recorded_as_job_submitted_in_the_jobs_stream(
    api: Api, store: EventStore
) -> None:
    headers = await api.create_team("nlp")
    job_id = await api.submit(headers)
    [envelope] = await store.read_stream(f"job-{job_id}")
    assert isinstance(envelope.payload, JobSubmitted)
    assert envelope.payload.submitted_by == "team:nlp"


async def test_the_job_follows_the_events_other_services_record(
    api: Api, store: EventStore
) -> None:
    job_id = await api.submit(api.as_admin())
    await store.append(
        f"job-{job_id}", 1, [JobAdmitted(job_id=job_id, queue="nlp", priority="research")]
    )
    await eventually_state(api, job_id, "queued")


async def test_another_teams_job_is_not_found(api: Api) -> None:
    nlp = await api.create_team("nlp")
    vision = await api.create_team("vision")
    job_id = await api.submit(nlp)
    response = await api.client.get(f"/v1/jobs/{job_id}", headers=vision)
    assert response.status_code == 404
    assert response.headers["content-type"] == "application/problem+json"


async def test_another_teams_job_cannot_be_cancelled(api: Api) -> None:
    nlp = await api.create_team("nlp")
    vision = await api.create_team("vision")
    job_id = await api.submit(nlp)
    response = await api.client.post(f"/v1/jobs/{job_id}/cancel", headers=vision)
    assert response.status_code == 404


async def test_submitting_for_another_team_is_forbidden(api: Api) -> None:
    await api.create_team("nlp")
    vision = await api.create_team("vision")
    response = await api.client.post(
        "/v1/jobs", json={"name": "train", "team": "nlp"}, headers=vision
    )
    assert response.status_code == 403
    assert response.json()["status"] == 403


async def test_a_team_lists_only_its_own_jobs(api: Api) -> None:
    nlp = await api.create_team("nlp")
    vision = await api.create_team("vision")
    mine = await api.submit(nlp)
    await api.submit(vision, team="vision")
    response = await api.client.get("/v1/jobs", headers=nlp)
    assert [job["id"] for job in response.json()["items"]] == [mine]


async def test_the_admin_lists_every_team_and_filters_by_team(api: Api) -> None:
    nlp = await api.create_team("nlp")
    vision = await api.create_team("vision")
    await api.submit(nlp)
    theirs = await api.submit(vision, team="vision")
    everyone = await api.client.get("/v1/jobs", headers=api.as_admin())
    only_vision = await api.client.get("/v1/jobs?team=vision", headers=api.as_admin())
    assert len(everyone.json()["items"]) == 2
    assert [job["id"] for job in only_vision.json()["items"]] == [theirs]


async def test_jobs_are_listed_a_page_at_a_time(api: Api) -> None:
    submitted = [await api.submit(api.as_admin()) for _ in range(5)]
    seen: list[str] = []
    cursor: int | None = None
    while True:
        params = {"limit": 2} | ({"after": cursor} if cursor is not None else {})
        page = (await api.client.get("/v1/jobs", params=params, headers=api.as_admin())).json()
        seen += [job["id"] for job in page["items"]]
        cursor = page["next"]
        if cursor is None:
            break
    assert seen == submitted


async def test_jobs_are_filtered_by_state(api: Api, store: EventStore) -> None:
    queued = await api.submit(api.as_admin())
    await api.submit(api.as_admin())
    await store.append(
        f"job-{queued}", 1, [JobAdmitted(job_id=queued, queue="nlp", priority="research")]
    )
    await eventually_state(api, queued, "queued")
    response = await api.client.get("/v1/jobs?state=queued", headers=api.as_admin())
    assert [job["id"] for job in response.json()["items"]] == [queued]


async def test_cancelling_a_live_job_records_the_request(api: Api, store: EventStore) -> None:
    job_id = await api.submit(api.as_admin())
    response = await api.client.post(f"/v1/jobs/{job_id}/cancel", headers=api.as_admin())
    assert response.status_code == 202
    assert response.json()["requested"] == ["cancel"]
    events = await store.read_stream(f"job-{job_id}")
    assert isinstance(events[-1].payload, JobCancelRequested)


async def test_cancelling_a_finished_job_conflicts(api: Api, store: EventStore) -> None:
    job_id = await api.submit(api.as_admin())
    await store.append(
        f"job-{job_id}", 1, [JobRejected(job_id=job_id, code="quota", reason="over ceiling")]
    )
    response = await api.client.post(f"/v1/jobs/{job_id}/cancel", headers=api.as_admin())
    assert response.status_code == 409
    assert response.headers["content-type"] == "application/problem+json"


async def test_resuming_a_job_that_is_not_suspended_conflicts(api: Api) -> None:
    job_id = await api.submit(api.as_admin())
    response = await api.client.post(f"/v1/jobs/{job_id}/resume", headers=api.as_admin())
    assert response.status_code == 409


async def test_suspending_a_waiting_job_records_the_request(api: Api) -> None:
    job_id = await api.submit(api.as_admin())
    response = await api.client.post(f"/v1/jobs/{job_id}/suspend", headers=api.as_admin())
    assert (response.status_code, response.json()["requested"]) == (202, ["suspend"])


async def test_an_unknown_job_is_not_found(api: Api) -> None:
    response = await api.client.get("/v1/jobs/nosuchjob", headers=api.as_admin())
    assert response.status_code == 404
    assert response.json()["detail"] == "job nosuchjob not found"
