"""A team's queue is created with the team: a team may not take over a queue that already
exists (an organisation's queue, a parent of other teams), or creating it would silently rewrite
that queue's guarantee and ceiling and make it a team's."""

from __future__ import annotations

import pytest

from services.runtime import EventStore
from tests.api.conftest import Api

pytestmark = pytest.mark.integration


async def test_a_team_named_like_an_existing_queue_is_refused_and_the_queue_kept(
    api: Api, store: EventStore
) -> None:
    org = await api.client.put(
        "/v1/queues/research", json={"guaranteed_gpus": 32, "max_gpus": 64}, headers=api.as_admin()
    )
    assert org.status_code == 200, org.text
    head = await store.head()
    team = await api.client.post(
        "/v1/teams",
        json={"name": "research", "guaranteed_gpus": 0, "max_gpus": 8},
        headers=api.as_admin(),
    )
    assert team.status_code == 409, team.text
    assert team.headers["content-type"] == "application/problem+json"
    assert "queue" in team.json()["detail"]
    assert await store.head() == head
    queues = (await api.client.get("/v1/queues", headers=api.as_admin())).json()["items"]
    [research] = [queue for queue in queues if queue["name"] == "research"]
    assert (research["guaranteed_gpus"], research["max_gpus"], research["is_team"]) == (
        32,
        64,
        False,
    )


async def test_a_team_under_an_organisation_queue_is_still_created(api: Api) -> None:
    org = await api.client.put(
        "/v1/queues/research", json={"guaranteed_gpus": 32, "max_gpus": 64}, headers=api.as_admin()
    )
    assert org.status_code == 200, org.text
    team = await api.client.post(
        "/v1/teams",
        json={"name": "nlp", "guaranteed_gpus": 16, "max_gpus": 32, "parent": "research"},
        headers=api.as_admin(),
    )
    assert team.status_code == 201, team.text
