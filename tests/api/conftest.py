"""The API wired to the real PostgreSQL of the local stack, driven through an ASGI transport.

The stack and the per-test database come from the integration tier's fixtures.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI

from services.api.app import create_app
from services.api.settings import ApiSettings
from services.runtime import Settings
from tests.integration.conftest import settings, stack, store  # noqa: F401  (fixtures)

ADMIN_TOKEN = "admin-token-for-tests-0123456789abcdef"


@dataclass
class Api:
    client: httpx.AsyncClient
    app: FastAPI
    settings: ApiSettings

    def as_admin(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {ADMIN_TOKEN}"}

    async def create_team(self, name: str, guaranteed_gpus: int = 8) -> dict[str, str]:
        """The new team's auth header."""
        response = await self.client.post(
            "/v1/teams",
            json={"name": name, "guaranteed_gpus": guaranteed_gpus, "max_gpus": 64},
            headers=self.as_admin(),
        )
        assert response.status_code == 201, response.text
        return {"Authorization": f"Bearer {response.json()['token']}"}

    async def submit(self, headers: dict[str, str], **fields: object) -> str:
        body = {"name": "train", "team": "nlp", "tasks": 2, "gpus_per_task": 4, **fields}
        response = await self.client.post("/v1/jobs", json=body, headers=headers)
        assert response.status_code == 201, response.text
        return str(response.json()["id"])


def api_settings(base: Settings, tmp_path: Path, **overrides: object) -> ApiSettings:
    return ApiSettings.model_validate(
        {
            **base.model_dump(),
            "admin_token": ADMIN_TOKEN,
            "admin_token_file": tmp_path / "admin.token",
            # Other writers' events (written by the tests as the services would) show up fast.
            "catch_up_interval_s": 0.05,
            **overrides,
        }
    )


@pytest.fixture
async def api(settings: Settings, tmp_path: Path) -> AsyncIterator[Api]:  # noqa: F811
    configured = api_settings(settings, tmp_path)
    app = create_app(configured, use_bus=False)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://gangway.test"
        ) as client,
    ):
        yield Api(client, app, configured)
