"""The `gangway` commands against a real API server (uvicorn in a thread) on the real log."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvicorn

from services.api.app import create_app
from services.runtime import Settings
from tests.api.conftest import ADMIN_TOKEN, api_settings
from tests.integration.conftest import settings, stack  # noqa: F401  (fixtures)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def log_env(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> Settings:  # noqa: F811
    """The commands that read the log directly find the test's database."""
    monkeypatch.setenv("GANGWAY_PG_DSN", settings.pg_dsn)
    return settings


@pytest.fixture
def api_url(
    settings: Settings,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[str]:
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    app = create_app(api_settings(settings, tmp_path, api_url=url), use_bus=False)
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
