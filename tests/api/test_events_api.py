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


async def test_an_arrays_events_are_its_elements_in_log_order(api: Api, store: EventStore) -> None:
    # Found by an attack: GET /v1/jobs/{array id} answered the array, while its /events
    # answered 404 "not found".
    nlp = await api.create_team("nlp")
    vision = await api.create_team("vision")
    body = {"name": "sweep", "team": "nlp", "gpus_per_task": 1, "array": {"count": 3}}
    created = await api.client.post("/v1/jobs", json=body, headers=nlp)
    assert created.status_code == 201, created.text
    array_id = created.json()["id"]
    second = f"{array_id}_1"
    await store.append(f"job-{second}", 1, [JobAdmitted(job_id=second, queue="nlp", priority="p")])

    answer = await api.client.get(f"/v1/jobs/{array_id}/events", headers=nlp)

    assert answer.status_code == 200, answer.text
    items = answer.json()["items"]
    assert [(e["type"], e["payload"]["job_id"]) for e in items] == [
        *(("JobSubmitted", f"{array_id}_{index}") for index in range(3)),
        ("JobAdmitted", second),
    ]
    assert [e["position"] for e in items] == sorted(e["position"] for e in items)
    one = await api.client.get(f"/v1/jobs/{second}/events", headers=nlp)
    assert [e["type"] for e in one.json()["items"]] == ["JobSubmitted", "JobAdmitted"]
    foreign = await api.client.get(f"/v1/jobs/{array_id}/events", headers=vision)
    assert foreign.status_code == 404
    assert foreign.json()["detail"] == f"job {array_id} not found"
