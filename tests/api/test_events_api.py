"""/v1/events and /v1/jobs/{id}/events: the audit over the log."""

from __future__ import annotations

import pytest

from schemas.jobs import JobAdmitted
from services.runtime import EventStore
from tests.api.conftest import Api

pytestmark = pytest.mark.integration


async def test_events_are_paged_by_cursor_without_gaps_or_repeats(api: Api) -> None:
    await api.create_team("nlp")  # two events: the team and its queue
    for _ in range(7):
        await api.submit(api.as_admin())
    positions: list[int] = []
    cursor = 0
    while True:
        page = (
            await api.client.get(
                "/v1/events", params={"after": cursor, "limit": 3}, headers=api.as_admin()
            )
        ).json()
        positions += [event["position"] for event in page["items"]]
        cursor = page["next"]
        if not page["has_more"]:
            break
    assert positions == list(range(1, 10))


async def test_events_are_filtered_by_type(api: Api, store: EventStore) -> None:
    job_id = await api.submit(api.as_admin())
    await api.submit(api.as_admin())
    await store.append(f"job-{job_id}", 1, [JobAdmitted(job_id=job_id, queue="q", priority="p")])
    page = (await api.client.get("/v1/events?type=JobAdmitted", headers=api.as_admin())).json()
    assert [(e["type"], e["stream"]) for e in page["items"]] == [("JobAdmitted", f"job-{job_id}")]


async def test_events_are_filtered_by_stream(api: Api) -> None:
    job_id = await api.submit(api.as_admin())
    await api.submit(api.as_admin())
    page = (
        await api.client.get(
            "/v1/events", params={"stream": f"job-{job_id}"}, headers=api.as_admin()
        )
    ).json()
    assert [e["payload"]["job_id"] for e in page["items"]] == [job_id]


async def test_a_jobs_events_are_its_streams_in_order(api: Api, store: EventStore) -> None:
    job_id = await api.submit(api.as_admin())
    await store.append(f"job-{job_id}", 1, [JobAdmitted(job_id=job_id, queue="q", priority="p")])
    response = await api.client.get(f"/v1/jobs/{job_id}/events", headers=api.as_admin())
    assert [e["type"] for e in response.json()["items"]] == ["JobSubmitted", "JobAdmitted"]


async def test_a_team_sees_only_the_events_of_its_own_jobs(api: Api) -> None:
    nlp = await api.create_team("nlp")
    vision = await api.create_team("vision")
    mine = await api.submit(nlp)
    await api.submit(vision, team="vision")
    page = (await api.client.get("/v1/events", headers=nlp)).json()
    job_streams = {e["stream"] for e in page["items"] if e["stream"].startswith("job-")}
    assert job_streams == {f"job-{mine}"}
