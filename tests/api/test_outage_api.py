"""The API while PostgreSQL is away: 503 problems with Retry-After, never 500; and a retried
submission with the same Idempotency-Key never submits twice."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from services.api.app import create_app
from services.runtime import EventStore, Settings
from tests.api.conftest import Api, api_settings
from tests.integration.proxy import TcpProxy

pytestmark = pytest.mark.integration

BODY = {"name": "train", "team": "nlp", "tasks": 2, "gpus_per_task": 4}


@contextlib.asynccontextmanager
async def behind_proxy(
    settings: Settings, tmp_path: Path, **overrides: object
) -> AsyncIterator[tuple[Api, TcpProxy]]:
    """The API, with its pool reaching PostgreSQL through a proxy the test can cut or stall."""
    proxy, dsn = await TcpProxy.for_dsn(settings.pg_dsn)
    configured = api_settings(settings, tmp_path, pg_dsn=dsn, **overrides)
    app = create_app(configured, use_bus=False)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://gangway.test"
        ) as client,
    ):
        yield Api(client, app, configured), proxy
    await proxy.cut()


@pytest.fixture
async def cut_off(settings: Settings, tmp_path: Path) -> AsyncIterator[tuple[Api, TcpProxy]]:
    async with behind_proxy(settings, tmp_path) as api_and_proxy:
        yield api_and_proxy


def assert_unavailable(response: httpx.Response) -> None:
    assert response.status_code == 503, response.text
    assert response.headers["content-type"] == "application/problem+json"
    assert int(response.headers["retry-after"]) > 0
    assert response.json()["type"].endswith("/unavailable")


async def test_every_route_that_needs_the_database_answers_503_while_it_is_away(
    cut_off: tuple[Api, TcpProxy],
) -> None:
    api, proxy = cut_off
    team = await api.create_team("nlp")
    job_id = await api.submit(team)
    await proxy.cut()
    assert_unavailable(await api.client.post("/v1/jobs", json=BODY, headers=team))
    assert_unavailable(await api.client.post(f"/v1/jobs/{job_id}/cancel", headers=team))
    assert_unavailable(await api.client.get(f"/v1/jobs/{job_id}/events", headers=team))
    assert_unavailable(await api.client.get("/v1/events", headers=api.as_admin()))
    assert_unavailable(
        await api.client.post(
            "/v1/teams",
            json={"name": "cv", "guaranteed_gpus": 8, "max_gpus": 8},
            headers=api.as_admin(),
        )
    )
    assert_unavailable(await api.client.get("/readyz"))
    await proxy.restore()
    response = await api.client.post("/v1/jobs", json=BODY, headers=team)
    assert response.status_code == 201, response.text


async def test_a_submission_retried_with_the_same_idempotency_key_creates_one_job(
    cut_off: tuple[Api, TcpProxy], store: EventStore
) -> None:
    api, proxy = cut_off
    team = await api.create_team("nlp")
    keyed = {**team, "Idempotency-Key": "run-42"}
    await proxy.cut()
    assert_unavailable(await api.client.post("/v1/jobs", json=BODY, headers=keyed))
    await proxy.restore()
    first = await api.client.post("/v1/jobs", json=BODY, headers=keyed)
    again = await api.client.post("/v1/jobs", json=BODY, headers=keyed)
    assert first.status_code == again.status_code == 201, (first.text, again.text)
    assert first.json()["id"] == again.json()["id"]
    submitted = await store.read_all(0, 1000, types=["JobSubmitted"])
    assert [e.stream for e in submitted] == [f"job-{first.json()['id']}"]
    other = await api.client.post(
        "/v1/jobs", json=BODY, headers={**team, "Idempotency-Key": "run-43"}
    )
    assert other.json()["id"] != first.json()["id"]


async def test_an_idempotency_key_reused_for_another_spec_is_refused(
    cut_off: tuple[Api, TcpProxy],
) -> None:
    api, _ = cut_off
    team = await api.create_team("nlp")
    keyed = {**team, "Idempotency-Key": "once"}
    assert (await api.client.post("/v1/jobs", json=BODY, headers=keyed)).status_code == 201
    changed = await api.client.post("/v1/jobs", json={**BODY, "tasks": 3}, headers=keyed)
    assert changed.status_code == 422
    assert changed.json()["type"].endswith("/idempotency-key-reused")


async def test_a_database_gone_silent_answers_503_within_the_command_timeout(
    settings: Settings, tmp_path: Path
) -> None:
    """A partition that drops packets, or a host that froze, sends no reset: without a bound
    on each statement the request would wait for TCP to give up (minutes, or never for a
    query already delivered). Each statement is bounded by `pg_command_timeout_s`."""
    bounds = {"pg_command_timeout_s": 1.0, "pg_connect_timeout_s": 1.0}
    async with behind_proxy(settings, tmp_path, **bounds) as (api, proxy):
        team = await api.create_team("nlp")
        proxy.stall()
        try:
            stalled = await asyncio.wait_for(
                api.client.post("/v1/jobs", json=BODY, headers=team), timeout=30
            )
            assert_unavailable(stalled)
        finally:
            proxy.heal()
        recovered = await api.client.post("/v1/jobs", json=BODY, headers=team)
        assert recovered.status_code == 201, recovered.text


async def test_an_admin_read_is_answered_from_what_the_worker_has_while_the_log_is_away(
    cut_off: tuple[Api, TcpProxy],
) -> None:
    """A read first waits for its worker's fold to reach the log's head (read-your-writes
    across workers); with the log away there is no head to reach, and the read is answered
    from what the worker has, as before, rather than 503. (A team's read needs the log for
    its token anyway.)"""
    api, proxy = cut_off
    team = await api.create_team("nlp")
    job_id = await api.submit(team)
    await proxy.cut()
    read = await api.client.get(f"/v1/jobs/{job_id}", headers=api.as_admin())
    assert read.status_code == 200, read.text
    assert read.json()["id"] == job_id
    listed = await api.client.get("/v1/jobs", headers=api.as_admin())
    assert job_id in [job["id"] for job in listed.json()["items"]]
    assert_unavailable(await api.client.get(f"/v1/jobs/{job_id}", headers=team))
