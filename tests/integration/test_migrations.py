"""Migrations: each applied once, in order, however many processes start together."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from services.runtime import Settings, migrate_settings
from services.runtime.migrate import shipped_migrations

pytestmark = pytest.mark.integration


async def _schema(settings: Settings) -> list[tuple[str, str]]:
    conn = await asyncpg.connect(settings.migration_dsn)
    try:
        rows = await conn.fetch(
            "SELECT table_name, column_name FROM information_schema.columns"
            " WHERE table_schema = 'public' ORDER BY table_name, ordinal_position"
        )
        return [(r["table_name"], r["column_name"]) for r in rows]
    finally:
        await conn.close()


async def test_migrating_again_changes_nothing(settings: Settings) -> None:
    before = await _schema(settings)

    applied = await migrate_settings(settings)

    assert applied == []
    assert await _schema(settings) == before


async def test_processes_migrating_at_once_apply_each_migration_once(settings: Settings) -> None:
    conn = await asyncpg.connect(settings.migration_dsn)
    try:
        # Back to an empty database: the fixture had migrated it.
        await conn.execute("DROP SCHEMA public CASCADE; CREATE SCHEMA public")
    finally:
        await conn.close()

    results = await asyncio.gather(*(migrate_settings(settings) for _ in range(4)))

    shipped = [m.version for m in shipped_migrations()]
    assert sorted(v for applied in results for v in applied) == shipped
    conn = await asyncpg.connect(settings.migration_dsn)
    try:
        recorded = [r["version"] for r in await conn.fetch("SELECT version FROM schema_migrations")]
    finally:
        await conn.close()
    assert sorted(recorded) == shipped
