"""The log is append-only by the database's own rules, whoever connects."""

from __future__ import annotations

import asyncpg
import pytest

from services.runtime import EventStore, Settings
from tests.integration.support import deferrals

pytestmark = pytest.mark.integration

CHANGES = {
    "update": "UPDATE events SET type = 'Forged' WHERE position = 1",
    "delete": "DELETE FROM events WHERE position = 1",
    "truncate": "TRUNCATE events",
}


@pytest.mark.parametrize("change", sorted(CHANGES))
async def test_the_application_role_cannot_change_or_remove_events(
    store: EventStore, settings: Settings, change: str
) -> None:
    await store.append("job-a", 0, deferrals("a", 1))
    conn = await asyncpg.connect(settings.pg_dsn)
    try:
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await conn.execute(CHANGES[change])
    finally:
        await conn.close()
    assert [e.type for e in await store.read_all()] == ["JobDeferred"]


@pytest.mark.parametrize("change", sorted(CHANGES))
async def test_even_the_owner_cannot_change_or_remove_events(
    store: EventStore, settings: Settings, change: str
) -> None:
    await store.append("job-a", 0, deferrals("a", 1))
    conn = await asyncpg.connect(settings.migration_dsn)
    try:
        with pytest.raises(asyncpg.RestrictViolationError, match="append-only"):
            await conn.execute(CHANGES[change])
    finally:
        await conn.close()
    assert [e.type for e in await store.read_all()] == ["JobDeferred"]
