"""A command that changes nothing records nothing: holding a held job, releasing one not held,
a PATCH whose fields are already the job's, asking to cancel twice. Only a change is an event,
so retries and repeated clicks never grow the log."""

from __future__ import annotations

import pytest

from services.runtime import EventStore
from tests.api.conftest import Api

pytestmark = pytest.mark.integration


async def test_commands_that_change_nothing_append_nothing(api: Api, store: EventStore) -> None:
    nlp = await api.create_team("nlp")
    job_id = await api.submit(nlp, priority="research", max_retries=2)

    async def events() -> list[str]:
        return [envelope.type for envelope in await store.read_stream(f"job-{job_id}")]

    for _ in range(2):
        assert (await api.client.post(f"/v1/jobs/{job_id}/release", headers=nlp)).is_success
    unchanged = {"priority": "research", "max_retries": 2, "hold": False}
    assert (await api.client.patch(f"/v1/jobs/{job_id}", json=unchanged, headers=nlp)).is_success
    assert (await api.client.patch(f"/v1/jobs/{job_id}", json={}, headers=nlp)).is_success
    assert await events() == ["JobSubmitted"]

    for _ in range(3):
        assert (await api.client.post(f"/v1/jobs/{job_id}/hold", headers=nlp)).is_success
    held = await api.client.patch(f"/v1/jobs/{job_id}", json={"hold": True}, headers=nlp)
    assert held.is_success and held.json()["held"] is True
    assert await events() == ["JobSubmitted", "JobHeld"]

    for _ in range(2):
        assert (await api.client.post(f"/v1/jobs/{job_id}/cancel", headers=nlp)).is_success
    assert await events() == ["JobSubmitted", "JobHeld", "JobCancelRequested"]
