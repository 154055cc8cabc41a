"""An app served without its lifespan (an ASGI transport) wires itself on the first request and
catches up with the log before every read, since nothing feeds it in the background."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from schemas.jobs import JobAdmitted
from services.api.app import create_app
from services.runtime import EventStore, Settings
from tests.api.conftest import ADMIN_TOKEN, api_settings

pytestmark = pytest.mark.integration


async def test_reads_see_other_writers_events_at_once_without_a_lifespan(
    settings: Settings, store: EventStore, tmp_path: Path
) -> None:
    app = create_app(api_settings(settings, tmp_path), use_bus=False)
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    try:
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://t"
        ) as client:
            team = await client.post("/v1/teams", json={"name": "nlp"}, headers=headers)
            assert team.status_code == 201, team.text
            created = await client.post(
                "/v1/jobs", json={"name": "a", "team": "nlp"}, headers=headers
            )
            job_id = created.json()["id"]
            await store.append(
                f"job-{job_id}", 1, [JobAdmitted(job_id=job_id, queue="nlp", priority="research")]
            )
            job = (await client.get(f"/v1/jobs/{job_id}", headers=headers)).json()
            assert job["state"] == "queued"
    finally:
        await app.state.bootstrap.close()


async def test_the_read_models_are_rebuilt_from_the_log_at_start(
    settings: Settings, tmp_path: Path
) -> None:
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    first = create_app(api_settings(settings, tmp_path), use_bus=False)
    async with (
        first.router.lifespan_context(first),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=first), base_url="http://t") as client,
    ):
        team = await client.post("/v1/teams", json={"name": "nlp"}, headers=headers)
        token = team.json()["token"]
        created = await client.post(
            "/v1/jobs",
            json={"name": "a", "team": "nlp"},
            headers={"Authorization": f"Bearer {token}"},
        )
    second = create_app(api_settings(settings, tmp_path), use_bus=False)
    async with (
        second.router.lifespan_context(second),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=second), base_url="http://t") as client,
    ):
        # The team's token and its job, both known only from the log.
        response = await client.get(
            f"/v1/jobs/{created.json()['id']}", headers={"Authorization": f"Bearer {token}"}
        )
        assert (response.status_code, response.json()["state"]) == (200, "pending")
