"""For the commands that read the log directly from PostgreSQL (replay, audit)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import asyncpg

from gangway.client import find_state_dir
from gangway.commands._common import InputError
from services.runtime.settings import Settings
from services.runtime.store import EventStore


@asynccontextmanager
async def open_log() -> AsyncIterator[EventStore]:
    """The store of GANGWAY_PG_DSN (or the nearest .gangway/env); unreachable → one line."""
    settings = Settings(_env_file=find_state_dir() / "env")
    try:
        store = await EventStore.connect(settings, producer="gangway-cli")
    except (OSError, asyncpg.PostgresError) as error:
        raise InputError(
            f"cannot open the event log at {_safe(settings.pg_dsn)}: {error}"
        ) from error
    try:
        yield store
    finally:
        await store.close()


def _safe(dsn: str) -> str:
    """The DSN without its password, for messages."""
    head, at, tail = dsn.rpartition("@")
    if not at:
        return dsn
    scheme, _, credentials = head.partition("://")
    user = credentials.split(":", 1)[0]
    return f"{scheme}://{user}@{tail}"
