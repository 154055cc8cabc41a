"""A throwaway database and topic prefix for one benchmark (not a benchmark itself)."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator

from services.runtime import Settings, migrate_settings
from services.runtime.scratch import delete_topics, scratch_database, with_database


@contextlib.asynccontextmanager
async def scratch_settings(**overrides: object) -> AsyncIterator[Settings]:
    """Settings for a new, migrated database (made by the owner role) and fresh topics."""
    base = Settings()
    tag = uuid.uuid4().hex[:10]
    async with scratch_database(base.migration_dsn, f"gw_bench_{tag}") as database:
        values = {
            **base.model_dump(),
            "pg_dsn": with_database(base.pg_dsn, database),
            "pg_owner_dsn": with_database(base.migration_dsn, database),
            "topic_prefix": f"bench-{tag}",
            "service_name": "bench",
            **overrides,
        }
        settings = Settings.model_validate(values)
        await migrate_settings(settings)
        yield settings
    await delete_topics(settings)
