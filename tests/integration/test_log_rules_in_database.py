"""The log's rules are the database's, not only the Python store's: as the services' role,
nothing but the append function writes the log, and it refuses gaps and stale epochs."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import asyncpg
import pytest

from services.runtime import EventStore, Settings
from services.runtime.leadership import acquire_leadership
from services.runtime.migrate import dsn_user
from tests.integration.support import deferrals

pytestmark = pytest.mark.integration

_APPEND = """
SELECT event_log_append($1::bigint[], ARRAY['job-forged'], ARRAY[1], ARRAY[$2::uuid],
                        ARRAY['JobCancelled'], ARRAY[1], ARRAY['{"job_id": "forged"}'],
                        ARRAY[NULL::uuid], ARRAY[NULL::uuid], ARRAY['forger'], ARRAY[$3::bigint],
                        now(), 'scheduler', 'gangway_events')
"""


@pytest.fixture
async def app(settings: Settings, store: EventStore) -> AsyncIterator[asyncpg.Connection]:
    """A session of the services' own role, on a log with one event and a leader at epoch 1."""
    assert dsn_user(settings.pg_dsn) != dsn_user(settings.migration_dsn), (
        "these tests need the services' role apart from the owner (scripts/stack.sh makes both)"
    )
    await store.append("job-a", 0, deferrals("a", 1))
    leader = await acquire_leadership(store, settings.pg_dsn, "leader-1")
    assert leader is not None and leader.epoch == 1
    conn: asyncpg.Connection = await asyncpg.connect(settings.pg_dsn)
    try:
        yield conn
    finally:
        await conn.close()
        await leader.release()


async def _head(conn: asyncpg.Connection) -> int:
    return int(await conn.fetchval("SELECT position FROM event_log_head"))


async def test_a_forged_append_with_a_stale_epoch_is_refused(app: asyncpg.Connection) -> None:
    head = await _head(app)
    with pytest.raises(asyncpg.PostgresError, match="stale leader epoch") as refused:
        await app.fetchval(_APPEND, [head + 1], uuid.uuid4(), 0)
    assert refused.value.sqlstate == "GW001"
    assert await _head(app) == head


async def test_an_append_that_does_not_continue_the_head_is_refused(
    app: asyncpg.Connection,
) -> None:
    head = await _head(app)
    for forged in (head + 5, head, 1):
        with pytest.raises(asyncpg.CheckViolationError, match="continue the log"):
            await app.fetchval(_APPEND, [forged], uuid.uuid4(), None)
    assert await _head(app) == head


async def test_the_append_function_with_the_current_epoch_appends(
    app: asyncpg.Connection, store: EventStore
) -> None:
    head = await _head(app)
    assert await app.fetchval(_APPEND, [head + 1], uuid.uuid4(), 1) == head + 1
    assert [e.type for e in await store.read_all_raw(head)] == ["JobCancelled"]


STRAIGHT_WRITES = {
    "insert into events": (
        "INSERT INTO events (position, stream, version, event_id, type, schema_version,"
        " payload, producer, epoch) VALUES ((SELECT position + 1 FROM event_log_head),"
        " 'job-forged', 1, gen_random_uuid(), 'JobCancelled', 1, '{}', 'forger', 0)"
    ),
    "update leader_epochs": "UPDATE leader_epochs SET epoch = epoch + 1",
    "insert into leader_epochs": "INSERT INTO leader_epochs VALUES ('forged', 7, 'forger')",
    "delete leader_epochs": "DELETE FROM leader_epochs",
    "update event_log_head": "UPDATE event_log_head SET position = position + 1",
    "lock the head for update": "SELECT position FROM event_log_head FOR UPDATE",
}


@pytest.mark.parametrize("write", sorted(STRAIGHT_WRITES))
async def test_the_services_role_cannot_write_the_log_head_or_epochs_directly(
    app: asyncpg.Connection, store: EventStore, write: str
) -> None:
    before = [e.event_id for e in await store.read_all()]
    epochs = await app.fetch("SELECT name, epoch FROM leader_epochs ORDER BY name")
    with pytest.raises(asyncpg.InsufficientPrivilegeError):
        await app.execute(STRAIGHT_WRITES[write])
    assert [e.event_id for e in await store.read_all()] == before
    assert await app.fetch("SELECT name, epoch FROM leader_epochs ORDER BY name") == epochs
    assert await _head(app) == len(before)
