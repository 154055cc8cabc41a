"""`checkpoint: {interval_s: auto}` (DESIGN §8): accepted as a submission and kept in the log
as written; anything else that is not a positive number of seconds is a 422 problem."""

from __future__ import annotations

import pytest

from schemas.jobs import JobSubmitted
from services.runtime import EventStore
from tests.api.conftest import Api

pytestmark = pytest.mark.integration

VALID = {"name": "train", "team": "nlp", "tasks": 1, "gpus_per_task": 1}


@pytest.mark.parametrize("interval", ["auto", 1800, 0.5])
async def test_a_checkpoint_interval_may_be_auto_or_seconds(
    api: Api, store: EventStore, interval: object
) -> None:
    headers = await api.create_team("nlp")
    body = {**VALID, "checkpoint": {"interval_s": interval}}

    response = await api.client.post("/v1/jobs", json=body, headers=headers)

    assert response.status_code == 201, response.text
    [envelope] = await store.read_stream(f"job-{response.json()['id']}")
    assert isinstance(envelope.payload, JobSubmitted)
    assert envelope.payload.spec.checkpoint.interval_s == interval


@pytest.mark.parametrize("interval", ["sometimes", "AUTO", "1800", 0, -60, True])
async def test_any_other_checkpoint_interval_is_a_validation_problem(
    api: Api, store: EventStore, interval: object
) -> None:
    headers = await api.create_team("nlp")
    before = await store.head()
    body = {**VALID, "checkpoint": {"interval_s": interval}}

    response = await api.client.post("/v1/jobs", json=body, headers=headers)

    assert response.status_code == 422, response.text
    assert response.headers["content-type"] == "application/problem+json"
    assert response.json()["type"] == "https://gangway.dev/problems/validation-error"
    assert await store.head() == before
