"""A throwaway database and topic prefix for one benchmark (not a benchmark itself)."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator
from urllib.parse import urlsplit, urlunsplit

import asyncpg
from aiokafka.admin import AIOKafkaAdminClient

from services.runtime import Settings, migrate_settings


def _with_database(dsn: str, database: str) -> str:
    return urlunsplit(urlsplit(dsn)._replace(path=f"/{database}"))


@contextlib.asynccontextmanager
async def scratch_settings(**overrides: object) -> AsyncIterator[Settings]:
    """Settings for a new, migrated database (made by the owner role) and fresh topics."""
    base = Settings()
    tag = uuid.uuid4().hex[:10]
    database = f"gw_bench_{tag}"
    owner = await asyncpg.connect(base.migration_dsn)
    try:
        await owner.execute(f'CREATE DATABASE "{database}"')
    finally:
        await owner.close()
    values = {
        **base.model_dump(),
        "pg_dsn": _with_database(base.pg_dsn, database),
        "pg_owner_dsn": _with_database(base.migration_dsn, database),
        "topic_prefix": f"bench-{tag}",
        "service_name": "bench",
        **overrides,
    }
    settings = Settings.model_validate(values)
    await migrate_settings(settings)
    try:
        yield settings
    finally:
        owner = await asyncpg.connect(base.migration_dsn)
        try:
            await owner.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
        finally:
            await owner.close()
        await _delete_topics(settings)


async def _delete_topics(settings: Settings) -> None:
    # Every partition left behind slows the local broker's next start.
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap)
    await admin.start()
    try:
        ours = [t for t in await admin.list_topics() if t.startswith(f"{settings.topic_prefix}.")]
        if ours:
            await admin.delete_topics(ours)
    finally:
        await admin.close()
