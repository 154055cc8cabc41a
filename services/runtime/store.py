"""The event store: appends with optimistic concurrency and epoch fencing, reads in commit order."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID, uuid4

import asyncpg

from schemas import REGISTRY, Event, EventEnvelope, EventRegistry
from services.runtime.errors import ConcurrencyConflict, EventTooLarge, StaleLeader
from services.runtime.limits import MAX_EVENT_BYTES
from services.runtime.records import Metadata, RawEvent, StreamAppend
from services.runtime.settings import Settings

NOTIFY_CHANNEL = "gangway_events"
SCHEDULER_LEADERSHIP = "scheduler"

_COLUMNS = (
    "position, stream, version, event_id, type, schema_version, payload::text, "
    "correlation_id, causation_id, producer, epoch, recorded_at"
)

# The SQLSTATE event_log_append raises for a write of a stale leader epoch.
_STALE_EPOCH = "GW001"

_FENCE = "SELECT leader_epoch_share($1)"

# A group of appends in one statement, one round trip inside the head row's lock (which
# serialises appends; see migrations/0001_event_log.sql): the function takes the lock, reads
# the streams' versions after it, skips each request whose expected versions do not hold and
# appends the rest with their notification through event_log_append, the one function the
# services' role may append with (it refuses positions that do not continue the head and rows
# of a stale leader epoch). migrations/0038 says what goes in and out.
_APPEND_CHECKED = """
SELECT recorded, positions, versions, checked
FROM event_log_append_checked($1::integer[], $2::text[], $3::integer[], $4::integer[],
                              $5::uuid[], $6::text[], $7::integer[], $8::text[], $9::uuid[],
                              $10::uuid[], $11::text[], $12::bigint[], $13, $14)
"""

# The same append, and in the same statement each written request's answered event recorded in
# a consumer's inbox (per request: the event's id, and the number of its first row): a
# consumer's batch as one statement of its own, with no COMMIT round trip inside the head
# row's lock, its inbox rows still written with its effects. A skipped request gets no inbox
# row: its event is handled again, after the conflict (services/admission `_decide_after`).
_APPEND_CHECKED_TRACKED = """
WITH written AS (
    SELECT recorded, positions, versions, checked
    FROM event_log_append_checked($1::integer[], $2::text[], $3::integer[], $4::integer[],
                                  $5::uuid[], $6::text[], $7::integer[], $8::text[],
                                  $9::uuid[], $10::uuid[], $11::text[], $12::bigint[], $13, $14)
), tracked AS (
    INSERT INTO inbox (consumer, event_id)
    SELECT $15, t.event_id
    FROM written
    CROSS JOIN LATERAL unnest(written.positions) WITH ORDINALITY AS p(position, n)
    JOIN unnest($16::uuid[], $17::integer[]) AS t(event_id, first_row) ON t.first_row = p.n
    WHERE p.position IS NOT NULL
    ON CONFLICT (consumer, event_id) DO NOTHING
)
SELECT recorded, positions, versions, checked FROM written
"""

_READ_STREAM = f"SELECT {_COLUMNS} FROM events WHERE stream = $1 AND version > $2 ORDER BY version"
_READ_STREAMS = f"SELECT {_COLUMNS} FROM events WHERE stream = ANY($1::text[]) ORDER BY position"

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
        arrive while one commits are written together in the next statement (a conflict skips
        only its own append). Appends are serialised by the log's head row anyway, so this
        turns one WAL flush per append into one per group.
        """
        payloads = _check_appends(appends, self.registry)
        request = _Request(appends, metadata or Metadata(), epoch, payloads)
        if sum(len(a.events) for a in appends) == 0:
            return []
        if conn is None and epoch is None:
            return await self._group_commit.submit(request)
        return await self._append_alone(request, leadership, conn)

    async def append_each(
        self,
        appends: Sequence[tuple[StreamAppend, Metadata]],
        *,
        conn: asyncpg.Connection,
        inbox: Inbox | None = None,
    ) -> list[list[EventEnvelope] | ConcurrencyConflict]:
        """Independent appends, each with its own metadata, in one statement whatever their
        number (a consumer writing a batch's reactions at once), inside the caller's
        transaction if it has one: each gets its envelopes, or its ConcurrencyConflict and
        writes nothing. With `inbox`, each written append's answered event is recorded in
        the consumer's inbox in the same statement (and a conflicting one's is not)."""
        if inbox is not None and len(inbox.event_ids) != len(appends):
            raise ValueError(f"{len(appends)} appends answer {len(inbox.event_ids)} events")
        requests = []
        for append, metadata in appends:
            if not append.events:
                raise ValueError(f"an append to {append.stream!r} without events")
            payloads = _check_appends([append], self.registry)
            requests.append(_Request([append], metadata, None, payloads))
        if not requests:
            return []
        return await self._write(conn, requests, inbox=inbox)

    async def _append_alone(
        self, request: _Request, leadership: str, conn: asyncpg.Connection | None = None
    ) -> list[EventEnvelope]:
        if conn is not None:
            # In the caller's transaction, without a savepoint of its own (two round trips
            # more per append): a stale epoch or a version conflict is found before anything
            # is written (the append statement skips a conflicting request rather than fail),
            # so the caller's transaction stays usable after either.
            if request.epoch is not None:
                await _check_epoch(conn, leadership, request.epoch)
            return await self._append_one(conn, request, leadership)
        # One statement, its own transaction: the epoch's check and share lock, then the head
        # row's lock, are taken inside it, and no COMMIT round trip is left inside the lock.
        async with self.pool.acquire() as c:
            return await self._append_one(c, request, leadership)

    async def _append_one(
        self, c: asyncpg.Connection, request: _Request, leadership: str
    ) -> list[EventEnvelope]:
        [result] = await self._write(c, [request], leadership)
        if isinstance(result, ConcurrencyConflict):
            raise result
        return result

    async def _write(
        self,
        c: asyncpg.Connection,
        requests: Sequence[_Request],
        leadership: str = SCHEDULER_LEADERSHIP,
        *,
        inbox: Inbox | None = None,
    ) -> list[list[EventEnvelope] | ConcurrencyConflict]:
        """Append `requests` in order in one statement (inside the caller's transaction, or as
        its own); a request whose expected versions do not hold is skipped and gets its
        ConcurrencyConflict instead. With `inbox` (one event per request), each written
        request's event is recorded in the consumer's inbox by the same statement."""
        rows = _Rows(self.producer)
        first_rows: list[int] = []  # per request, the number of its first row (from 1)
        for index, request in enumerate(requests):
            first_rows.append(len(rows.event_ids) + 1)
            payloads = iter(request.payloads)
            for append in request.appends:
                rows.begin(index, append)
                for event in append.events:
                    rows.add(event, next(payloads), request.meta, request.epoch)
        tracked: tuple[Any, ...] = ()
        if inbox is not None:
            tracked = (inbox.consumer, list(inbox.event_ids), first_rows)
        try:
            recorded_at, positions, versions, found = await c.fetchrow(
                _APPEND_CHECKED if inbox is None else _APPEND_CHECKED_TRACKED,
                *rows.columns(),
                leadership,
                NOTIFY_CHANNEL,
                *tracked,
            )
        except asyncpg.PostgresError as refused:
            if refused.sqlstate == _STALE_EPOCH:
                # The database's fence: the append statement names the current epoch (its
                # detail); event_log_append's backstop does not (-1).
                epoch = next((r.epoch for r in requests if r.epoch is not None), 0)
                detail = getattr(refused, "detail", None)
                current = int(detail) if detail and detail.isdigit() else -1
                raise StaleLeader(leadership, epoch, current) from refused
            raise
        return rows.outcomes(recorded_at, positions or [], versions or [], found or [])

    # ------------------------------------------------------------------ reads

    async def read_stream(
        self, stream: str, after_version: int = 0, *, conn: asyncpg.Connection | None = None
    ) -> list[EventEnvelope]:
        """The stream's events after `after_version`, in order, upcast and typed."""
        async with self.connection(conn) as c:
            records = await c.fetch(_READ_STREAM, stream, after_version)
        return [RawEvent(*r).decode(self.registry) for r in records]

    async def read_streams(
        self, streams: Sequence[str], *, conn: asyncpg.Connection | None = None
    ) -> list[EventEnvelope]:
        """Every event of these streams, in log order, upcast and typed (one query: an array's
        history is up to 2,000 streams)."""
        async with self.connection(conn) as c:
            records = await c.fetch(_READ_STREAMS, list(streams))
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


async def keep_session(_conn: asyncpg.Connection) -> None:
    """The pools' reset on release: nothing sent to the server.

    asyncpg's default reset runs `SELECT pg_advisory_unlock_all(); CLOSE ALL; UNLISTEN *;
    RESET ALL` on every release, a round trip awaited before the connection is back (measured
    alone: 90 -> 210 us of client CPU and 0.3 -> 0.8 ms per acquire, plus the server's work),
    several times per submission on its way through the services. A pooled connection never
    holds that session state here: session advisory locks (relay, leadership, migrations) and
    LISTEN (relay, scheduler) live on their own connections, nothing runs SET or a cursor WITH
    HOLD. asyncpg still rolls back an open transaction and drops listeners before calling this.
    """


async def create_pool(settings: Settings, dsn: str | None = None) -> asyncpg.Pool:
    pool = await asyncpg.create_pool(
        dsn or settings.pg_dsn,
        min_size=settings.pg_pool_min,
        max_size=settings.pg_pool_max,
        command_timeout=settings.pg_command_timeout_s,
        timeout=settings.pg_connect_timeout_s,
        reset=keep_session,
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


def _check_appends(appends: Sequence[StreamAppend], registry: EventRegistry) -> tuple[str, ...]:
    """Check the appends' shape and bound; return every event's payload as stored, in order
    (serialised once, here, in the caller's task)."""
    payloads: list[str] = []
    seen: set[str] = set()
    for append in appends:
        if append.stream in seen:
            raise ValueError(f"stream {append.stream!r} appears twice in one append")
        seen.add(append.stream)
        if append.expected_version is not None and append.expected_version < 0:
            raise ValueError(f"expected version of {append.stream!r} is negative")
        dumped = append.payloads
        if dumped is not None and len(dumped) != len(append.events):
            raise ValueError(
                f"{len(append.events)} events to {append.stream!r} with {len(dumped)} payloads"
            )
        for index, event in enumerate(append.events):
            if event.stream != append.stream:
                raise ValueError(
                    f"{event.type} belongs to stream {event.stream!r}, not {append.stream!r}"
                )
            if registry.model(event.type) is not type(event):
                raise ValueError(f"{type(event).__name__} is not the registered {event.type}")
            payload = event.model_dump_json() if dumped is None else dumped[index]
            # len() counts characters, each at most 4 bytes in UTF-8: encode only near the bound.
            if len(payload) * 4 > MAX_EVENT_BYTES and len(payload.encode()) > MAX_EVENT_BYTES:
                raise EventTooLarge(event.type, len(payload.encode()), MAX_EVENT_BYTES)
            payloads.append(payload)
    return tuple(payloads)


@dataclass(frozen=True, slots=True)
class Inbox:
    """A consumer's inbox rows to write with its appends: per append, the event it answers."""

    consumer: str
    event_ids: Sequence[UUID]


@dataclass(frozen=True, slots=True)
class _Request:
    appends: Sequence[StreamAppend]
    meta: Metadata
    epoch: int | None
    payloads: tuple[str, ...]


class _GroupCommit:
    """Writes the appends that queue up while a transaction commits in the next transaction.

    One writer task per store, started on demand. Each append keeps its own outcome (a
    conflict fails only its own); only the commit, and its WAL flush, is shared. Epoch-fenced
    appends never join a group: their leader_epochs lock must come before the head row's lock,
    as in every other append.
    """

    max_group = 512

    def __init__(self, store: EventStore) -> None:
        self.store = store
        self.pending: list[tuple[_Request, asyncio.Future[list[EventEnvelope]]]] = []
        self.writer: asyncio.Task[None] | None = None

    async def submit(self, request: _Request) -> list[EventEnvelope]:
        future: asyncio.Future[list[EventEnvelope]] = asyncio.get_running_loop().create_future()
        self.pending.append((request, future))
        if self.writer is None or self.writer.done():
            self.writer = asyncio.create_task(self._drain())
        return await future

    async def _drain(self) -> None:
        while self.pending:
            group, self.pending = self.pending[: self.max_group], self.pending[self.max_group :]
            try:
                # One statement, its own transaction: the head row's lock is held for the
                # statement and its commit, not across round trips (no BEGIN, no COMMIT).
                async with self.store.pool.acquire() as c:
                    results = await self.store._write(c, [request for request, _ in group])
            except asyncpg.PostgresError as refused:
                if len(group) == 1:
                    _settle(group[0][1], refused)
                    continue
                # The server refused a statement, so nothing of the group was committed: write
                # each append alone, so that only the one at fault fails.
                for request, future in group:
                    try:
                        alone = await self.store._append_alone(request, SCHEDULER_LEADERSHIP)
                    except Exception as error:
                        _settle(future, error)
                    else:
                        _settle(future, alone)
                continue
            except Exception as error:
                for _, future in group:
                    _settle(future, error)
                continue
            for (_, future), result in zip(group, results, strict=True):
                _settle(future, result)

    async def close(self) -> None:
        if self.writer is not None and not self.writer.done():
            await self.writer


def _settle(
    future: asyncio.Future[list[EventEnvelope]], result: list[EventEnvelope] | Exception
) -> None:
    if future.done():
        return  # the caller stopped waiting; the append's outcome stands regardless
    if isinstance(result, Exception):
        future.set_exception(result)
    else:
        future.set_result(result)


class _Rows:
    """The arguments of event_log_append_checked: one list per column of the appends (their
    request, stream, expected version and number of rows) and of the rows."""

    def __init__(self, producer: str) -> None:
        self.producer = producer
        self.requests: list[int] = []
        self.streams: list[str] = []
        self.expected: list[int | None] = []
        self.counts: list[int] = []
        self.event_ids: list[UUID] = []
        self.types: list[str] = []
        self.schema_versions: list[int] = []
        self.payloads: list[str] = []
        self.correlation_ids: list[UUID | None] = []
        self.causation_ids: list[UUID | None] = []
        self.producers: list[str] = []
        self.epochs: list[int | None] = []
        self.events: list[Event] = []

    def begin(self, request: int, append: StreamAppend) -> None:
        self.requests.append(request)
        self.streams.append(append.stream)
        self.expected.append(append.expected_version)
        self.counts.append(0)

    def add(self, event: Event, payload: str, meta: Metadata, epoch: int | None) -> None:
        self.counts[-1] += 1
        self.event_ids.append(uuid4())
        self.types.append(event.type)
        self.schema_versions.append(event.schema_version)
        self.payloads.append(payload)
        self.correlation_ids.append(meta.correlation_id)
        self.causation_ids.append(meta.causation_id)
        self.producers.append(meta.producer or self.producer)
        self.epochs.append(epoch)
        self.events.append(event)

    def columns(self) -> tuple[list[Any], ...]:
        return (
            self.requests,
            self.streams,
            self.expected,
            self.counts,
            self.event_ids,
            self.types,
            self.schema_versions,
            self.payloads,
            self.correlation_ids,
            self.causation_ids,
            self.producers,
            self.epochs,
        )

    def outcomes(
        self,
        recorded_at: datetime,
        positions: Sequence[int | None],
        versions: Sequence[int | None],
        found: Sequence[int],
    ) -> list[list[EventEnvelope] | ConcurrencyConflict]:
        """Per request, what the database made of it: its envelopes, or the conflict that
        kept it out (the first of its appends whose stream was not at the expected version).
        A request's rows were all written or none (every request has a row: callers append
        no empty request)."""
        out: list[list[EventEnvelope] | ConcurrencyConflict] = []
        row = 0
        a = 0
        while a < len(self.requests):
            b = a
            while b < len(self.requests) and self.requests[b] == self.requests[a]:
                b += 1
            if positions[row] is None:
                out.append(
                    next(
                        ConcurrencyConflict(self.streams[i], self.expected[i], found[i])
                        for i in range(a, b)
                        if self.expected[i] is not None and self.expected[i] != found[i]
                    )
                )
                row += sum(self.counts[a:b])
            else:
                envelopes = []
                for i in range(a, b):
                    for _ in range(self.counts[i]):
                        position, version = positions[row], versions[row]
                        assert position is not None and version is not None
                        envelopes.append(self._envelope(row, i, position, version, recorded_at))
                        row += 1
                out.append(envelopes)
            a = b
        return out

    def _envelope(
        self, r: int, a: int, position: int, version: int, recorded_at: datetime
    ) -> EventEnvelope:
        return EventEnvelope(
            event_id=self.event_ids[r],
            stream=self.streams[a],
            version=version,
            position=position,
            type=self.types[r],
            schema_version=self.schema_versions[r],
            payload=self.events[r],
            recorded_at=recorded_at,
            correlation_id=self.correlation_ids[r],
            causation_id=self.causation_ids[r],
            producer=self.producers[r],
            epoch=self.epochs[r],
        )
