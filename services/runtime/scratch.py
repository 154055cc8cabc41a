"""Throwaway databases and topics for tests and benchmarks: the one way to make and drop them.

The owner role creates a database, the caller migrates and uses it, and it is dropped on
leaving, sessions and all. Not used by the services themselves.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from urllib.parse import urlsplit, urlunsplit

import asyncpg

from services.runtime.kafka import make_admin
from services.runtime.settings import Settings


def with_database(dsn: str, database: str) -> str:
    """The same server and role, another database."""
    return urlunsplit(urlsplit(dsn)._replace(path=f"/{database}"))


@contextlib.asynccontextmanager
async def scratch_database(owner_dsn: str, database: str) -> AsyncIterator[str]:
    """Create `database` with the owner role; drop it on leaving; yields its name."""
    owner = await asyncpg.connect(owner_dsn)
    try:
        await owner.execute(f'CREATE DATABASE "{database}"')
    finally:
        await owner.close()
    try:
        yield database
    finally:
        await drop_database(owner_dsn, database)


async def drop_database(owner_dsn: str, database: str) -> None:
    # Stopped services' sessions end a moment after their processes; until then the owner may
    # not end them (they belong to the services' role), so the drop is retried for a while.
    owner = await asyncpg.connect(owner_dsn)
    try:
        for _ in range(50):
            try:
                await owner.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
                return
            except asyncpg.InsufficientPrivilegeError:
                await asyncio.sleep(0.2)
    finally:
        await owner.close()


async def delete_topics(settings: Settings) -> None:
    """Delete the topics named `<settings.topic_prefix>.*`, and the ACLs granted on them: every
    partition left behind slows the broker."""
    from services.runtime import bus_acl
    from services.runtime.topics import Topics

    prefix = settings.topic_prefix
    admin = make_admin(settings)
    await admin.start()
    try:
        ours = [t for t in await admin.list_topics() if t.startswith(f"{prefix}.")]
        if ours:
            await admin.delete_topics(ours)
    finally:
        await admin.close()
    if bus_acl.is_admin(settings):
        await bus_acl.revoke_prefix(settings, Topics(prefix))
