"""Teams, queues and the unauthenticated endpoints (health, readiness, metrics, docs)."""

from __future__ import annotations

import hashlib

import httpx
import pytest

from schemas.teams import QueueConfigured, TeamCreated
from services.runtime import EventStore
from tests.api.conftest import Api

pytestmark = pytest.mark.integration


async def test_a_new_teams_token_authenticates_the_team(api: Api) -> None:
    headers = await api.create_team("nlp")
    response = await api.client.get("/v1/jobs", headers=headers)
    assert response.status_code == 200


async def test_only_the_tokens_sha256_is_recorded(api: Api, store: EventStore) -> None:
    response = await api.client.post(
        "/v1/teams", json={"name": "nlp", "guaranteed_gpus": 8}, headers=api.as_admin()
    )
    token = response.json()["token"]
    assert len(token) >= 43  # 32 random bytes, URL-safe
    [created] = await store.read_stream("team-nlp")
    assert isinstance(created.payload, TeamCreated)
    assert created.payload.token_sha256 == hashlib.sha256(token.encode()).hexdigest()
    assert token not in created.payload.model_dump_json()


async def test_creating_a_team_configures_its_queue(api: Api, store: EventStore) -> None:
    await api.create_team("nlp", guaranteed_gpus=16)
    [configured] = await store.read_stream("queue-nlp")
    assert isinstance(configured.payload, QueueConfigured)
    assert configured.payload.guaranteed_gpus == 16


async def test_creating_an_existing_team_conflicts(api: Api) -> None:
    await api.create_team("nlp")
    response = await api.client.post(
        "/v1/teams", json={"name": "nlp", "guaranteed_gpus": 8}, headers=api.as_admin()
    )
    assert response.status_code == 409


async def test_a_max_below_the_guarantee_is_refused(api: Api) -> None:
    response = await api.client.post(
        "/v1/teams",
        json={"name": "nlp", "guaranteed_gpus": 8, "max_gpus": 4},
        headers=api.as_admin(),
    )
    assert response.status_code == 422


async def test_a_configured_queue_is_listed_with_its_quota(api: Api) -> None:
    org = {"guaranteed_gpus": 64, "max_gpus": None}
    assert (await api.client.put("/v1/queues/org", json=org, headers=api.as_admin())).is_success
    response = await api.client.put(
        "/v1/queues/research",
        json={"parent": "org", "guaranteed_gpus": 32, "max_gpus": 64, "weight": 2},
        headers=api.as_admin(),
    )
    assert response.status_code == 200
    listed = await api.client.get("/v1/queues", headers=api.as_admin())
    [queue] = [q for q in listed.json()["items"] if q["name"] == "research"]
    assert (queue["parent"], queue["guaranteed_gpus"], queue["max_gpus"], queue["weight"]) == (
        "org",
        32,
        64,
        2.0,
    )


async def test_health_needs_no_token(api: Api) -> None:
    response = await api.client.get("/healthz")
    assert (response.status_code, response.json()["status"]) == (200, "ok")


async def test_ready_when_the_read_models_caught_up_with_the_log(api: Api) -> None:
    await api.submit(api.as_admin())
    response = await api.client.get("/readyz")
    assert response.status_code == 200
    assert response.json()["detail"]["lag"] == 0


async def test_metrics_count_requests_and_pending_jobs(api: Api) -> None:
    await api.submit(api.as_admin(), priority="production")
    text = (await api.client.get("/metrics")).text
    assert 'gangway_api_requests_total{method="POST",route="/v1/jobs",status="201"} 1.0' in text
    assert 'gangway_pending_jobs{class="production"} 1.0' in text
    assert "gangway_api_consumer_lag_events" in text


async def test_the_openapi_document_is_served_with_stable_operation_ids(api: Api) -> None:
    spec = (await api.client.get("/openapi.json")).json()
    operations = {op["operationId"] for path in spec["paths"].values() for op in path.values()}
    assert {
        "submitJob",
        "getJob",
        "listJobs",
        "cancelJob",
        "listEvents",
        "createTeam",
    } <= operations
    assert (await api.client.get("/docs")).status_code == 200


async def test_the_admin_lists_every_team_and_a_team_sees_only_its_own(api: Api) -> None:
    nlp = await api.create_team("nlp", guaranteed_gpus=16)
    await api.create_team("vision")
    await api.submit(nlp, tasks=1, gpus_per_task=2)
    everyone = await api.client.get("/v1/teams", headers=api.as_admin())
    assert everyone.status_code == 200
    assert [t["name"] for t in everyone.json()["items"]] == ["nlp", "vision"]
    first = everyone.json()["items"][0]
    assert (first["queue"], first["guaranteed_gpus"], first["max_gpus"]) == ("nlp", 16, 64)
    assert (first["pending_jobs"], first["allocated_gpus"]) == (1, 0)

    own = await api.client.get("/v1/teams", headers=nlp)
    assert [t["name"] for t in own.json()["items"]] == ["nlp"]
    assert (await api.client.get("/v1/teams/nlp", headers=nlp)).json()["name"] == "nlp"
    other = await api.client.get("/v1/teams/vision", headers=nlp)
    assert other.status_code == 403
    assert other.headers["content-type"] == "application/problem+json"
    missing = await api.client.get("/v1/teams/nobody", headers=api.as_admin())
    assert missing.status_code == 404
    assert (await api.client.get("/v1/teams")).status_code == 401


async def test_a_reconfigured_queue_shows_in_its_teams_quota(api: Api) -> None:
    await api.create_team("nlp", guaranteed_gpus=8)
    quota = {"guaranteed_gpus": 24, "max_gpus": 32}
    assert (await api.client.put("/v1/queues/nlp", json=quota, headers=api.as_admin())).is_success
    [team] = (await api.client.get("/v1/teams", headers=api.as_admin())).json()["items"]
    assert (team["guaranteed_gpus"], team["max_gpus"]) == (24, 32)


async def test_metrics_name_teams_only_to_the_operator(api: Api) -> None:
    """`/metrics` needs no token (Prometheus, probes). The per-team series (team names, GPUs,
    waits, GPU time) go to the operator: the admin token, or a tokenless scrape from the API's
    own host (loopback, as the service metrics); a team's token, a bad one, or a tokenless
    scrape from elsewhere see the cluster's series only (docs/security-api.md)."""
    nlp = await api.create_team("nlp")
    await api.submit(nlp, priority="production")
    team_series = ("gangway_team_gpus_allocated", "gangway_queue_wait_seconds", "gangway_requeues")
    elsewhere = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=api.app, client=("203.0.113.7", 40000)),
        base_url="http://gangway.test",
    )
    async with elsewhere:
        scrapes = [
            await elsewhere.get("/metrics"),
            await elsewhere.get("/metrics", headers=nlp),
            await api.client.get("/metrics", headers=nlp),
            await api.client.get("/metrics", headers={"Authorization": "Bearer not-a-token"}),
        ]
        operators = [
            await elsewhere.get("/metrics", headers=api.as_admin()),
            await api.client.get("/metrics"),  # loopback, no token
        ]
    for public in (scrape.text for scrape in scrapes):
        assert 'gangway_pending_jobs{class="production"} 1.0' in public
        assert "gangway_jobs" in public and "gangway_gpus_free_unusable" in public
        assert "nlp" not in public
        assert not any(name in public for name in team_series)
    for operator in (scrape.text for scrape in operators):
        assert 'gangway_pending_jobs{class="production"} 1.0' in operator
        assert all(name in operator for name in team_series)


async def test_a_scrape_right_after_a_submission_counts_it(api: Api) -> None:
    """Every scrape is rendered afresh: nothing served from an earlier one hides a change."""
    before = (await api.client.get("/metrics")).text
    assert 'gangway_pending_jobs{class="production"} 1.0' not in before
    await api.submit(api.as_admin(), priority="production")
    after = (await api.client.get("/metrics")).text
    assert 'gangway_pending_jobs{class="production"} 1.0' in after
