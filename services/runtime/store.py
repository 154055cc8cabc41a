"""The event store: appends with optimistic concurrency and epoch fencing, reads in commit order."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Any
from uuid import UUID, uuid4

import asyncpg

from schemas import REGISTRY, Event, EventEnvelope, EventRegistry
from services.runtime.errors import ConcurrencyConflict, StaleLeader
from services.runtime.records import Metadata, RawEvent, StreamAppend
from services.runtime.settings import Settings

NOTIFY_CHANNEL = "gangway_events"
SCHEDULER_LEADERSHIP = "scheduler"

_COLUMNS = (
    "position, stream, version, event_id, type, schema_version, payload::text, "
    "correlation_id, causation_id, producer, epoch, recorded_at"
)

_FENCE = "SELECT epoch FROM leader_epochs WHERE name = $1 FOR SHARE"

# Taking the head row's lock serialises appends; see migrations/0001_event_log.sql.
_CLAIM_POSITIONS = (
    "UPDATE event_log_head SET position = position + $1 RETURNING position, clock_timestamp()"
)

# A new statement after the lock, so its snapshot holds every append committed before ours.
_STREAM_VERSIONS = """
SELECT s.stream,
       COALESCE((SELECT max(e.version) FROM events e WHERE e.stream = s.stream), 0)
FROM unnest($1::text[]) AS s(stream)
"""

_INSERT = """
INSERT INTO events (position, stream, version, event_id, type, schema_version, payload,
                    correlation_id, causation_id, producer, epoch, recorded_at)
SELECT u.position, u.stream, u.version, u.event_id, u.type, u.schema_version, u.payload::jsonb,
       $8, $9, $10, $11, $12
FROM unnest($1::bigint[], $2::text[], $3::integer[], $4::uuid[], $5::text[], $6::integer[],
            $7::text[]) AS u(position, stream, version, event_id, type, schema_version, payload)
"""

_READ_STREAM = f"SELECT {_COLUMNS} FROM events WHERE stream = $1 AND version > $2 ORDER BY version"

_READ_ALL = f"""
SELECT {_COLUMNS} FROM events
WHERE position > $1
  AND ($3::text[] IS NULL OR type = ANY($3::text[]))
  AND ($4::text IS NULL OR stream = $4::text)
ORDER BY position
LIMIT $2
"""

_READ_RANGE = (
    f"SELECT {_COLUMNS} FROM events WHERE position > $1 AND position <= $2 ORDER BY position"
)


class EventStore:
    """The append-only log in PostgreSQL.

    Every method takes an optional `conn`: given one (inside a transaction), the call joins
    that transaction, which is how a consumer appends events atomically with its inbox row.
    """

    def __init__(
        self,
        pool: asyncpg.Pool,
        *,
        producer: str,
        registry: EventRegistry = REGISTRY,
        owns_pool: bool = False,
    ) -> None:
        self.pool = pool
        self.producer = producer
        self.registry = registry
        self._owns_pool = owns_pool
        self._group_commit = _GroupCommit(self)

    @classmethod
    async def connect(
        cls, settings: Settings, *, producer: str | None = None, registry: EventRegistry = REGISTRY
    ) -> EventStore:
        pool = await create_pool(settings)
        return cls(
            pool, producer=producer or settings.service_name, registry=registry, owns_pool=True
        )

    async def close(self) -> None:
        await self._group_commit.close()
        if self._owns_pool:
            await self.pool.close()

    @asynccontextmanager
    async def connection(self, conn: asyncpg.Connection | None = None) -> AsyncIterator[Any]:
        if conn is not None:
            yield conn
        else:
            async with self.pool.acquire() as acquired:
                yield acquired

    # ------------------------------------------------------------------ appends

    async def append(
        self,
        stream: str,
        expected_version: int | None,
        events: Sequence[Event],
        metadata: Metadata | None = None,
        *,
        epoch: int | None = None,
        leadership: str = SCHEDULER_LEADERSHIP,
        conn: asyncpg.Connection | None = None,
    ) -> list[EventEnvelope]:
        """Append `events` to `stream` if its version is `expected_version`.

        Raises ConcurrencyConflict when it is not, and StaleLeader when `epoch` is given and is
        not the current epoch of `leadership`; either way nothing is appended.
        """
        return await self.append_many(
            [StreamAppend(stream, expected_version, events)],
            metadata,
            epoch=epoch,
            leadership=leadership,
            conn=conn,
        )

    async def append_many(
        self,
        appends: Sequence[StreamAppend],
        metadata: Metadata | None = None,
        *,
        epoch: int | None = None,
        leadership: str = SCHEDULER_LEADERSHIP,
        conn: asyncpg.Connection | None = None,
    ) -> list[EventEnvelope]:
        """Append to several streams in one transaction: all of them, or none.

        Without `conn` or `epoch`, the append joins the store's group commit: appends that
        arrive while one commits are written together in the next transaction (each in a
        savepoint of its own, so a conflict fails only its own append). Appends are serialised
        by the log's head row anyway, so this turns one WAL flush per append into one per group.
        """
        _check_appends(appends, self.registry)
        meta = metadata or Metadata()
        if sum(len(a.events) for a in appends) == 0:
            return []
        if conn is None and epoch is None:
            return await self._group_commit.submit(appends, meta)
        async with self.connection(conn) as c, c.transaction():
            return await self._append_in(c, appends, meta, epoch, leadership)

    async def _append_in(
        self,
        c: asyncpg.Connection,
        appends: Sequence[StreamAppend],
        meta: Metadata,
        epoch: int | None,
        leadership: str,
    ) -> list[EventEnvelope]:
        """The append itself, inside the caller's transaction."""
        count = sum(len(a.events) for a in appends)
        if epoch is not None:
            await _check_epoch(c, leadership, epoch)
        last, recorded_at = await c.fetchrow(_CLAIM_POSITIONS, count)
        current = dict(await c.fetch(_STREAM_VERSIONS, [a.stream for a in appends]))
        rows = _Rows()
        position = last - count
        for append in appends:
            actual: int = current[append.stream]
            if append.expected_version is not None and append.expected_version != actual:
                raise ConcurrencyConflict(append.stream, append.expected_version, actual)
            for offset, event in enumerate(append.events, start=1):
                position += 1
                rows.add(position, append.stream, actual + offset, event)
        producer = meta.producer or self.producer
        await c.execute(
            _INSERT,
            *rows.columns(),
            meta.correlation_id,
            meta.causation_id,
            producer,
            epoch,
            recorded_at,
        )
        await c.execute("SELECT pg_notify($1, $2)", NOTIFY_CHANNEL, str(last))
        return rows.envelopes(meta, producer, epoch, recorded_at)

    # ------------------------------------------------------------------ reads

    async def read_stream(
        self, stream: str, after_version: int = 0, *, conn: asyncpg.Connection | None = None
    ) -> list[EventEnvelope]:
        """The stream's events after `after_version`, in order, upcast and typed."""
        async with self.connection(conn) as c:
            records = await c.fetch(_READ_STREAM, stream, after_version)
        return [RawEvent(*r).decode(self.registry) for r in records]

    async def stream_version(self, stream: str, *, conn: asyncpg.Connection | None = None) -> int:
        async with self.connection(conn) as c:
            version = await c.fetchval(
                "SELECT COALESCE(max(version), 0) FROM events WHERE stream = $1", stream
            )
        return int(version)

    async def read_all(
        self,
        after_position: int = 0,
        limit: int = 1000,
        *,
        types: Sequence[str] | None = None,
        stream: str | None = None,
        conn: asyncpg.Connection | None = None,
    ) -> list[EventEnvelope]:
        """Events after `after_position` in commit order, optionally of `types` / one `stream`."""
        raw = await self.read_all_raw(after_position, limit, types=types, stream=stream, conn=conn)
        return [r.decode(self.registry) for r in raw]

    async def read_all_raw(
        self,
        after_position: int = 0,
        limit: int = 1000,
        *,
        types: Sequence[str] | None = None,
        stream: str | None = None,
        conn: asyncpg.Connection | None = None,
    ) -> list[RawEvent]:
        async with self.connection(conn) as c:
            records = await c.fetch(
                _READ_ALL, after_position, limit, list(types) if types else None, stream
            )
        return [RawEvent(*r) for r in records]

    async def head(self, *, conn: asyncpg.Connection | None = None) -> int:
        """The position of the last committed event (0 for an empty log)."""
        async with self.connection(conn) as c:
            return int(await c.fetchval("SELECT position FROM event_log_head"))

    async def iter_raw(
        self, after_position: int = 0, *, until: int | None = None, batch_size: int = 10_000
    ) -> AsyncIterator[list[RawEvent]]:
        """The whole log (up to `until`, default the head when called) in batches, for replay.

        Positions are gap-free, so each batch is one index range scan, with no long-running
        transaction holding back vacuum.
        """
        async with self.pool.acquire() as c:
            end = (
                until
                if until is not None
                else int(await c.fetchval("SELECT position FROM event_log_head"))
            )
            statement = await c.prepare(_READ_RANGE)
            make = RawEvent._make
            start = after_position
            while start < end:
                stop = min(start + batch_size, end)
                records = await statement.fetch(start, stop)
                if records:
                    yield [make(r) for r in records]
                start = stop

    async def replay(
        self, after_position: int = 0, *, batch_size: int = 10_000
    ) -> AsyncIterator[EventEnvelope]:
        """The log as typed envelopes, in commit order (decoding costs more than reading)."""
        async for batch in self.iter_raw(after_position, batch_size=batch_size):
            for raw in batch:
                yield raw.decode(self.registry)


async def create_pool(settings: Settings, dsn: str | None = None) -> asyncpg.Pool:
    pool = await asyncpg.create_pool(
        dsn or settings.pg_dsn,
        min_size=settings.pg_pool_min,
        max_size=settings.pg_pool_max,
    )
    assert pool is not None
    return pool


async def _check_epoch(conn: asyncpg.Connection, leadership: str, epoch: int) -> None:
    # FOR SHARE: a new leader's epoch bump waits for this append to commit, and every append
    # that starts after the bump sees the new epoch.
    current = await conn.fetchval(_FENCE, leadership)
    current_epoch = 0 if current is None else int(current)
    if epoch != current_epoch:
        raise StaleLeader(leadership, epoch, current_epoch)


def _check_appends(appends: Sequence[StreamAppend], registry: EventRegistry) -> None:
    seen: set[str] = set()
    for append in appends:
        if append.stream in seen:
            raise ValueError(f"stream {append.stream!r} appears twice in one append")
        seen.add(append.stream)
        if append.expected_version is not None and append.expected_version < 0:
            raise ValueError(f"expected version of {append.stream!r} is negative")
        for event in append.events:
            if event.stream != append.stream:
                raise ValueError(
                    f"{event.type} belongs to stream {event.stream!r}, not {append.stream!r}"
                )
            if registry.model(event.type) is not type(event):
                raise ValueError(f"{type(event).__name__} is not the registered {event.type}")


_Pending = tuple[Sequence[StreamAppend], Metadata, "asyncio.Future[list[EventEnvelope]]"]


class _GroupCommit:
    """Writes the appends that queue up while a transaction commits in the next transaction.

    One writer task per store, started on demand; each append keeps its own outcome (a
    savepoint each), only the commit is shared. Epoch-fenced appends never join a group: their
    leader_epochs lock must come before the head row's lock, as in every other append.
    """

    max_group = 256

    def __init__(self, store: EventStore) -> None:
        self.store = store
        self.pending: list[_Pending] = []
        self.writer: asyncio.Task[None] | None = None

    async def submit(self, appends: Sequence[StreamAppend], meta: Metadata) -> list[EventEnvelope]:
        future: asyncio.Future[list[EventEnvelope]] = asyncio.get_running_loop().create_future()
        self.pending.append((appends, meta, future))
        if self.writer is None or self.writer.done():
            self.writer = asyncio.create_task(self._write())
        return await future

    async def _write(self) -> None:
        while self.pending:
            group, self.pending = self.pending[: self.max_group], self.pending[self.max_group :]
            results: list[list[EventEnvelope] | BaseException] = []
            try:
                async with self.store.pool.acquire() as c, c.transaction():
                    for appends, meta, _ in group:
                        try:
                            async with c.transaction():
                                results.append(
                                    await self.store._append_in(
                                        c, appends, meta, None, SCHEDULER_LEADERSHIP
                                    )
                                )
                        except (ConcurrencyConflict, asyncpg.PostgresError) as refused:
                            results.append(refused)
            except BaseException as error:
                for _, _, future in group:
                    if not future.done():
                        future.set_exception(error)
                if not isinstance(error, Exception):
                    raise
                continue
            for (_, _, future), result in zip(group, results, strict=True):
                if future.done():
                    continue  # the caller gave up waiting; the append stands regardless
                if isinstance(result, BaseException):
                    future.set_exception(result)
                else:
                    future.set_result(result)

    async def close(self) -> None:
        if self.writer is not None and not self.writer.done():
            await self.writer


class _Rows:
    """The columns of one INSERT ... SELECT FROM unnest(...), one list per column."""

    def __init__(self) -> None:
        self.positions: list[int] = []
        self.streams: list[str] = []
        self.versions: list[int] = []
        self.event_ids: list[UUID] = []
        self.types: list[str] = []
        self.schema_versions: list[int] = []
        self.payloads: list[str] = []
        self.events: list[Event] = []

    def add(self, position: int, stream: str, version: int, event: Event) -> None:
        self.positions.append(position)
        self.streams.append(stream)
        self.versions.append(version)
        self.event_ids.append(uuid4())
        self.types.append(event.type)
        self.schema_versions.append(event.schema_version)
        self.payloads.append(event.model_dump_json())
        self.events.append(event)

    def columns(self) -> tuple[list[Any], ...]:
        return (
            self.positions,
            self.streams,
            self.versions,
            self.event_ids,
            self.types,
            self.schema_versions,
            self.payloads,
        )

    def envelopes(
        self, meta: Metadata, producer: str, epoch: int | None, recorded_at: datetime
    ) -> list[EventEnvelope]:
        return [
            EventEnvelope(
                event_id=event_id,
                stream=stream,
                version=version,
                position=position,
                type=event.type,
                schema_version=event.schema_version,
                payload=event,
                recorded_at=recorded_at,
                correlation_id=meta.correlation_id,
                causation_id=meta.causation_id,
                producer=producer,
                epoch=epoch,
            )
            for position, stream, version, event_id, event in zip(
                self.positions,
                self.streams,
                self.versions,
                self.event_ids,
                self.events,
                strict=True,
            )
        ]
