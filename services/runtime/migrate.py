"""SQL migrations: applied in order, once each, under a lock, then the app role's grants."""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from importlib import resources
from urllib.parse import urlsplit

import asyncpg

from services.runtime.settings import Settings

log = logging.getLogger(__name__)

# Every process migrates at start; the lock makes the second one wait, then find nothing to do.
_LOCK_KEY = "gangway.migrations"


class MigrationError(RuntimeError):
    """The database's migration history disagrees with the migrations shipped in this code."""


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()


def shipped_migrations() -> list[Migration]:
    """The migrations in `services/runtime/migrations`, named `NNNN_what.sql`, in order."""
    found: list[Migration] = []
    for entry in resources.files("services.runtime").joinpath("migrations").iterdir():
        if not entry.name.endswith(".sql"):
            continue
        number, _, rest = entry.name.partition("_")
        if not number.isdigit():
            raise MigrationError(f"migration {entry.name} does not start with its number")
        found.append(Migration(int(number), rest.removesuffix(".sql"), entry.read_text("utf-8")))
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions):
        raise MigrationError(f"two migrations share a number: {versions}")
    return found


def dsn_user(dsn: str) -> str | None:
    return urlsplit(dsn).username


async def migrate(dsn: str, *, app_role: str | None = None) -> list[int]:
    """Apply the missing migrations with the owner's `dsn`; return the versions applied now.

    `app_role`, when given and different from the owner, receives the services' privileges:
    SELECT on the event log, appends only through its function, and nothing that could change
    or remove an event.
    """
    conn: asyncpg.Connection = await asyncpg.connect(dsn)
    try:
        await conn.execute("SELECT pg_advisory_lock(hashtextextended($1, 0))", _LOCK_KEY)
        try:
            applied = await _apply(conn)
            owner = await conn.fetchval("SELECT current_user")
            if app_role and app_role != owner:
                await _grant(conn, app_role)
            return applied
        finally:
            await conn.execute("SELECT pg_advisory_unlock(hashtextextended($1, 0))", _LOCK_KEY)
    finally:
        await conn.close()


async def migrate_settings(settings: Settings) -> list[int]:
    """Migrate the database of `settings`, granting the services' role (the user of pg_dsn)."""
    return await migrate(settings.migration_dsn, app_role=dsn_user(settings.pg_dsn))


async def _apply(conn: asyncpg.Connection) -> list[int]:
    await conn.execute(
        """
        CREATE TABLE IF NOT EXISTS schema_migrations (
            version     integer     PRIMARY KEY,
            name        text        NOT NULL,
            checksum    text        NOT NULL,
            applied_at  timestamptz NOT NULL DEFAULT now()
        )
        """
    )
    done = {
        row["version"]: row["checksum"]
        for row in await conn.fetch("SELECT version, checksum FROM schema_migrations")
    }
    applied: list[int] = []
    for migration in shipped_migrations():
        if migration.version in done:
            if done[migration.version] != migration.checksum:
                raise MigrationError(
                    f"migration {migration.version} ({migration.name}) was edited after it was"
                    " applied; write a new migration instead"
                )
            continue
        async with conn.transaction():
            await conn.execute(migration.sql)
            await conn.execute(
                "INSERT INTO schema_migrations (version, name, checksum) VALUES ($1, $2, $3)",
                migration.version,
                migration.name,
                migration.checksum,
            )
        log.info("applied migration %04d %s", migration.version, migration.name)
        applied.append(migration.version)
    return applied


# The functions the services' role writes the log and the epochs through (migrations/0030,
# 0038).
_APPEND_FUNCTIONS = (
    "event_log_head_lock()",
    "event_log_append(bigint[], text[], integer[], uuid[], text[], integer[], text[], uuid[],"
    " uuid[], text[], bigint[], timestamptz, text, text)",
    "event_log_append_checked(integer[], text[], integer[], integer[], uuid[], text[],"
    " integer[], text[], uuid[], uuid[], text[], bigint[], text, text)",
    "leader_epoch_share(text)",
    "leader_epoch_bump(text, text)",
)


async def _grant(conn: asyncpg.Connection, role: str) -> None:
    ident = await conn.fetchval("SELECT quote_ident($1)", role)
    async with conn.transaction():
        await conn.execute(f"GRANT USAGE ON SCHEMA public TO {ident}")
        await conn.execute(
            f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {ident}"
        )
        await conn.execute(f"GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO {ident}")
        # The log and the migration history are read-only to the services; only the trigger
        # stands behind this for the owner.
        await conn.execute(
            f"REVOKE UPDATE, DELETE, TRUNCATE, REFERENCES, TRIGGER ON events FROM {ident}"
        )
        await conn.execute(
            f"REVOKE INSERT, UPDATE, DELETE, TRUNCATE ON schema_migrations FROM {ident}"
        )
        # The log's rules live in the database (migrations/0030): the services append only
        # through event_log_append and raise an epoch only through leader_epoch_bump; the
        # events, the head and the epochs are not theirs to write directly.
        await conn.execute(f"REVOKE INSERT ON events FROM {ident}")
        await conn.execute(
            f"REVOKE INSERT, UPDATE, DELETE, TRUNCATE ON event_log_head FROM {ident}"
        )
        await conn.execute(f"REVOKE INSERT, UPDATE, DELETE, TRUNCATE ON leader_epochs FROM {ident}")
        for function in _APPEND_FUNCTIONS:
            await conn.execute(f"GRANT EXECUTE ON FUNCTION {function} TO {ident}")
