"""The `gangway` commands against a real API server (uvicorn in a thread) on the real log."""

from __future__ import annotations

import pytest

from services.runtime import Settings
from tests.api.conftest import api_url  # noqa: F401  (fixtures)
from tests.integration.conftest import settings, stack  # noqa: F401  (fixtures)


@pytest.fixture
def log_env(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> Settings:  # noqa: F811
    """The commands that read the log directly find the test's database."""
    monkeypatch.setenv("GANGWAY_PG_DSN", settings.pg_dsn)
    return settings
