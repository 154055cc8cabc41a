"""Opening the event log at a service's start, when the database may be away.

A supervisor starts a service again whenever it exits, outages included: one started while
PostgreSQL is down waits for it (one log line when lost, a summary now and then, one when back,
as `Outage` says), instead of dying with a traceback in a restart loop.
"""

from __future__ import annotations

import asyncio
import logging

from services.runtime.errors import DATABASE_UNAVAILABLE
from services.runtime.migrate import migrate_settings
from services.runtime.retry import Outage, until_available
from services.runtime.settings import Settings
from services.runtime.store import EventStore


async def open_store(
    settings: Settings,
    *,
    producer: str,
    log: logging.Logger,
    stop: asyncio.Event | None,
    migrate: bool = False,
) -> EventStore | None:
    """The service's store (migrated first with `migrate`), once the database answers; None
    if `stop` was set first."""
    outage = Outage(log, f"{producer}: the event log")
    if migrate:
        migrated = await until_available(
            lambda: migrate_settings(settings), outage, stop, transient=DATABASE_UNAVAILABLE
        )
        if migrated is None:
            return None
    return await until_available(
        lambda: EventStore.connect(settings, producer=producer),
        outage,
        stop,
        transient=DATABASE_UNAVAILABLE,
    )
