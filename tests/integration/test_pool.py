"""The services' pools hand a connection back without a round trip, and still clean it."""

from __future__ import annotations

import asyncpg

from services.runtime import Settings
from services.runtime.store import create_pool


async def _last_query(settings: Settings, pid: int) -> str:
    other: asyncpg.Connection = await asyncpg.connect(settings.pg_dsn)
    try:
        return str(await other.fetchval("SELECT query FROM pg_stat_activity WHERE pid = $1", pid))
    finally:
        await other.close()


async def test_a_released_connection_sends_nothing_more_to_the_server(settings: Settings) -> None:
    # asyncpg's default reset would run `SELECT pg_advisory_unlock_all(); ... RESET ALL` here.
    pool = await create_pool(settings)
    try:
        async with pool.acquire() as conn:
            pid = await conn.fetchval("SELECT pg_backend_pid()")
            await conn.execute("SELECT 'the last statement'")
        assert await _last_query(settings, pid) == "SELECT 'the last statement'"
    finally:
        await pool.close()


async def test_a_connection_released_inside_a_transaction_comes_back_out_of_it(
    settings: Settings,
) -> None:
    pool = await create_pool(settings, dsn=settings.pg_dsn)
    try:
        conn = await pool.acquire()
        await conn.execute("BEGIN")
        await conn.execute("CREATE TEMP TABLE left_open (x int)")
        await pool.release(conn)
        async with pool.acquire() as again:
            assert not again.is_in_transaction()
            assert await again.fetchval("SELECT to_regclass('pg_temp.left_open')") is None
    finally:
        await pool.close()
