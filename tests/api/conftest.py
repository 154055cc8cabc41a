"""The API wired to the real PostgreSQL of the local stack, driven through an ASGI transport.

The stack and the per-test database come from the integration tier's fixtures.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
import uvicorn
from fastapi import FastAPI

from gangway.launcher import free_port
from services.agent.log_server import LogServer
from services.agent.log_server import create_app as create_log_app
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
    teams: dict[str, dict[str, str]] = field(default_factory=dict)

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
        self.teams[name] = {"Authorization": f"Bearer {response.json()['token']}"}
        return self.teams[name]

    async def submit(self, headers: dict[str, str], **fields: object) -> str:
        """Submit a job (of team nlp unless told), creating its team first if need be: the API
        refuses a job of a team it does not know."""
        body = {"name": "train", "team": "nlp", "tasks": 2, "gpus_per_task": 4, **fields}
        if body["team"] not in self.teams:
            await self.create_team(str(body["team"]))
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
            "logs_poll_s": 0.05,
            **overrides,
        }
    )


@dataclass
class AgentLogs:
    """A real agent log endpoint (services/agent/log_server.py) over the test's own work
    directory, `root`; `running` holds the (job, attempt)s it says still run."""

    root: Path
    url: str
    running: set[tuple[str, int]] = field(default_factory=set)


@contextlib.contextmanager
def serve_agent_logs(base: Settings, tmp_path: Path) -> Iterator[AgentLogs]:
    """The agent's log server over `tmp_path/agent`, in a thread of its own, under the
    services' key."""
    root = tmp_path / "agent"
    root.mkdir(exist_ok=True)
    bound = LogServer("127.0.0.1", 0)
    served = AgentLogs(root.resolve(), bound.url)
    app = create_log_app(
        served.root, base.bus_signing_key, lambda job, attempt: (job, attempt) in served.running
    )
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(
        target=server.run, kwargs={"sockets": [bound.socket]}, name="agent-logs", daemon=True
    )
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the log server did not start"
        time.sleep(0.02)
    try:
        yield served
    finally:
        server.should_exit = True
        thread.join(30)
        bound.socket.close()


@contextlib.asynccontextmanager
async def serving(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    """A client of `app` through an ASGI transport, the app started (its lifespan) first."""
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://gangway.test"
        ) as client,
    ):
        yield client


@pytest.fixture
async def api(
    settings: Settings,  # noqa: F811
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> AsyncIterator[Api]:
    """The API on the test's database through an ASGI transport, its agents' logs served by
    `agent_logs`; a test module's `API_OVERRIDES` (ApiSettings fields) configure it."""
    with serve_agent_logs(settings, tmp_path) as agent_logs:
        configured = api_settings(
            settings,
            tmp_path,
            agent_logs_url=agent_logs.url,
            **getattr(request.module, "API_OVERRIDES", {}),
        )
        app = create_app(configured, use_bus=False)
        async with serving(app) as client:
            yield Api(client, app, configured)


@pytest.fixture
def api_url(
    settings: Settings,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
) -> Iterator[str]:
    """A real API server (uvicorn in a thread) on the test's database; the CLI's environment
    points at it with the admin token. A test module's `API_OVERRIDES` (ApiSettings fields)
    configure it."""
    api_overrides: dict[str, object] = getattr(request.module, "API_OVERRIDES", {})
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with serve_agent_logs(settings, tmp_path) as agent_logs:
        configured = api_settings(
            settings, tmp_path, api_url=url, agent_logs_url=agent_logs.url, **api_overrides
        )
        app = create_app(configured, use_bus=False)
        server = uvicorn.Server(
            uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
        )
        thread = threading.Thread(target=server.run, name="api-under-test", daemon=True)
        thread.start()
        deadline = time.monotonic() + 30
        while not server.started:
            assert thread.is_alive() and time.monotonic() < deadline, "the API did not start"
            time.sleep(0.02)
        monkeypatch.setenv("GANGWAY_API_URL", url)
        monkeypatch.setenv("GANGWAY_TOKEN", ADMIN_TOKEN)
        monkeypatch.setenv("GANGWAY_PG_DSN", settings.pg_dsn)
        try:
            yield url
        finally:
            server.should_exit = True
            thread.join(30)
