"""The outbox relay: the log is the outbox; publish it to Kafka in position order.

At least once: the position is stored only after Kafka acknowledged every event up to it, so
a relay that dies re-publishes from there, and consumers' inboxes absorb the duplicates.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any, TypeVar

import asyncpg
from aiokafka import AIOKafkaProducer
from aiokafka.errors import (
    CorruptRecordException,
    MessageSizeTooLargeError,
    RecordListTooLargeError,
    RecordTooLargeError,
)
from aiokafka.partitioner import DefaultPartitioner, murmur2
from aiokafka.producer.message_accumulator import BatchBuilder
from aiokafka.record.default_records import DefaultRecordBatchBuilder
from prometheus_client import Counter, Gauge

from services.runtime.errors import DATABASE_UNAVAILABLE
from services.runtime.kafka import make_producer, start_producer, stop_producer
from services.runtime.limits import MAX_MESSAGE_BYTES
from services.runtime.metrics import new_registry
from services.runtime.records import RawEvent
from services.runtime.retry import Outage
from services.runtime.settings import Settings
from services.runtime.signals import sleep_unless
from services.runtime.signing import signed
from services.runtime.store import NOTIFY_CHANNEL, EventStore
from services.runtime.topics import Topics, ensure_topics

log = logging.getLogger(__name__)

T = TypeVar("T")

# A record's size as the producer's `send` checks it against its request bound.
_estimate_size = DefaultRecordBatchBuilder.estimate_size_in_bytes

# How long a liveness ping of the lock's session, or a producer's stop, may take.
_PING_TIMEOUT_S = 2.0
# The stored position trails what Kafka acknowledged by at most this long: under a stream of
# small rounds (single submissions) a write and commit of the position per round was a tenth
# of the relay's CPU and a WAL flush each on the server. A relay that dies re-publishes at most
# this much more from its stored position, which consumers' inboxes absorb as they absorb any
# redelivery; a quiet relay stores its position once the interval has passed.
POSITION_STORE_INTERVAL_S = 0.5
# Streams whose partition the relay remembers (StreamPartitioner).
_PARTITIONS_REMEMBERED = 65_536

_TRY_LOCK = "SELECT pg_try_advisory_lock(hashtextextended('gangway.relay.' || $1, 0))"
_LOAD = "SELECT position FROM relay_positions WHERE name = $1"
# GREATEST: a position never moves back, even if two relays briefly overlap.
_STORE = """
INSERT INTO relay_positions AS r (name, position) VALUES ($1, $2)
ON CONFLICT (name) DO UPDATE SET position = GREATEST(r.position, EXCLUDED.position),
                                 updated_at = now()
"""


# What the bus refuses for the record itself: no retry can publish it, so it is dead-lettered.
UNPUBLISHABLE: tuple[type[BaseException], ...] = (
    MessageSizeTooLargeError,
    RecordTooLargeError,
    RecordListTooLargeError,
    CorruptRecordException,
)

_DEAD_LETTER = """
INSERT INTO relay_dead_letters (relay, position, event_id, stream, type, size_bytes, reason)
VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (relay, position) DO NOTHING
"""


def message_headers(raw: RawEvent) -> list[tuple[str, bytes]]:
    """Lets consumers route or skip a message without parsing its body."""
    return [
        ("type", raw.type.encode()),
        ("schema_version", str(raw.schema_version).encode()),
        ("event_id", str(raw.event_id).encode()),
        ("position", str(raw.position).encode()),
    ]


class StreamPartitioner:
    """aiokafka's default partitioner (murmur2 of the key, as Java's client), remembering each
    key's hash: a job's events (submitted, admitted, reserved, ...) are published in different
    rounds under the same key, and the pure-Python murmur2 was a tenth of the relay's CPU in a
    batch burst. Same partition for every key as DefaultPartitioner (tests/runtime)."""

    def __init__(self, remembered: int = _PARTITIONS_REMEMBERED) -> None:
        self.remembered = remembered
        self._hashes: dict[bytes, int] = {}

    def __call__(self, key: bytes | None, all_partitions: list[int], available: list[int]) -> int:
        if key is None:
            return int(DefaultPartitioner()(key, all_partitions, available))
        hashed = self._hashes.get(key)
        if hashed is None:
            if len(self._hashes) >= self.remembered:
                self._hashes.clear()  # a bound, not an LRU: refilled from the live streams
            hashed = self._hashes[key] = murmur2(key) & 0x7FFFFFFF
        return all_partitions[hashed % len(all_partitions)]

    def __len__(self) -> int:
        """How many keys' hashes it holds now."""
        return len(self._hashes)


@dataclass(slots=True)
class _PartitionBatch:
    """One record batch of a round for one partition: its records are those of the round's
    read from index `first` on that go to the partition, until the batch is full; `nth`
    counts the partition's batches in the round."""

    builder: BatchBuilder
    topic: str
    partition: int
    first: int
    nth: int

    def add(self, key: bytes, value: bytes, headers: list[tuple[str, bytes]]) -> bool:
        """False when the batch is full (the record was not added)."""
        added = self.builder.append(timestamp=None, key=key, value=value, headers=headers)
        return added is not None


class OutboxRelay:
    def __init__(
        self,
        store: EventStore,
        settings: Settings,
        *,
        name: str | None = None,
        topics: Topics | None = None,
    ) -> None:
        self.store = store
        self.settings = settings
        self.name = name or settings.relay_name
        self.topics = topics or Topics.from_settings(settings)
        # What Kafka acknowledged, and what relay_positions holds (and since when).
        self.position = 0
        self._stored = 0
        self._stored_at = 0.0
        self.dead_letters = 0
        self.lag = 0
        self.registry = new_registry()
        self._dead_letters = Counter(
            "gangway_relay_dead_letters",
            "Events of the log the bus refused, dead-lettered by the relay",
            registry=self.registry,
        )
        self._lag = Gauge(
            "gangway_relay_lag_events",
            "Events committed to the log that the relay has not published yet",
            registry=self.registry,
        )
        self._producer: AIOKafkaProducer | None = None
        # The partition of each record, as the producer's `send` would pick it.
        self._partitioner = StreamPartitioner()
        self._wake = asyncio.Event()
        # Whether the last publish_pending read the log up to its head.
        self._read_to_head = False

    async def run(self, stop: asyncio.Event) -> None:
        """Publish until `stop` is set. Only one relay of a name is active; others stand by.

        The lock lives on the LISTEN connection's session: when that session ends (a database
        restart, pg_terminate_backend) the relay stops publishing at once, opens a new
        session, and competes for the lock again. Outages of either side are retried with
        jittered backoff and logged once per change of state.
        """
        database = Outage(log, f"relay {self.name}: the event log")
        bus = Outage(log, f"relay {self.name}: the bus")
        try:
            while not stop.is_set():
                try:
                    listener: asyncpg.Connection = await asyncpg.connect(self.settings.pg_dsn)
                except DATABASE_UNAVAILABLE as error:
                    await database.sleep(error, stop)
                    continue
                try:
                    if not await self._wait_for_lock(listener, stop):
                        return
                    await listener.add_listener(NOTIFY_CHANNEL, self._on_notify)
                    database.recovered()
                    await self._publish_while_locked(listener, stop, bus)
                except DATABASE_UNAVAILABLE as error:
                    await database.sleep(error, stop)
                finally:
                    listener.terminate()
        finally:
            if self.position > self._stored:
                # Spares the next relay re-publishing it; bounded, and harmless if it fails.
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(self.store_position(self.position), _PING_TIMEOUT_S)
            await self._stop_producer()

    async def _publish_while_locked(
        self, listener: asyncpg.Connection, stop: asyncio.Event, bus: Outage
    ) -> None:
        """Publish while `listener`'s session (and so the lock) lives; database errors
        propagate (the caller reconnects), the bus's are retried here."""
        self.position = await self.load_position()
        log.info("relay %s resumes after position %d", self.name, self.position)
        topics_ready = False
        while not stop.is_set():
            if listener.is_closed():
                log.warning("relay %s: its lock session ended; competing again", self.name)
                return
            self._wake.clear()
            try:
                if not topics_ready:
                    await _unless_stopped(ensure_topics(self.settings, self.topics), stop)
                    topics_ready = True
                sent = await _unless_stopped(self.publish_pending(), stop)
                # A read that ended short of a batch reached the head: no query to learn the
                # lag is 0 (what was committed since has notified, and is published next).
                if not self._read_to_head:
                    self.lag = max(0, await self.store.head() - self.position)
                else:
                    self.lag = 0
                self._lag.set(self.lag)
                bus.recovered()
            except DATABASE_UNAVAILABLE:
                raise
            except Exception as error:
                # Kafka errors (timeouts, broker restarts) all land here: start over from
                # the stored position with a fresh producer.
                delay = bus.failed(error)
                await self._restart_producer()
                self.position = await self.load_position()
                await sleep_unless(stop, delay)
                continue
            # After a busy round, let the appends of the next few milliseconds gather: one
            # read and one Kafka request then carry them all (none after a quiet round).
            gather = self.settings.gather_policy.wait_after(sent or 0)
            if gather and await sleep_unless(stop, gather):
                return
            woken = await self._sleep_until_woken(stop, self._store_due())
            if self._store_due() == 0.0:
                await self.store_position(self.position)
            elif not woken:
                # No notification for a poll interval: is the lock's session still there?
                await asyncio.wait_for(listener.fetchval("SELECT 1"), _PING_TIMEOUT_S)

    async def publish_pending(self) -> int:
        """Publish everything after the stored position; return how many events were sent."""
        producer = await self._ensure_producer()
        sent = 0
        self._read_to_head = False
        while True:
            batch = await self.store.read_all_raw(self.position, self.settings.relay_batch_size)
            if not batch:
                self._read_to_head = True
                return sent
            refused = await self._publish_round(producer, batch)
            if refused is not None:
                producer = await self._publish_one_by_one(batch[refused:])
            self.position = batch[-1].position
            if self._store_due() == 0.0:
                await self.store_position(self.position)
            sent += len(batch)
            if len(batch) < self.settings.relay_batch_size:
                self._read_to_head = True
                return sent

    async def _publish_round(self, producer: AIOKafkaProducer, batch: list[RawEvent]) -> int | None:
        """Publish a read of the log, each partition's records in log order, and wait for
        Kafka's acknowledgement of all of them; returns the index in `batch` of the first
        record of the first batch the bus refused (None: none was). Raises what else failed.

        The records are written straight into per-partition record batches (aiokafka's
        `create_batch` / `send_batch`), the partition being the one `send` would pick: a
        `send` per record (its metadata wait, size check, partitioner call, accumulator append
        and future) was a third of the relay's CPU in a batch burst. A record over the
        producer's request bound ends the round before it: the one-by-one path refuses it."""
        builders: dict[tuple[str, int], _PartitionBatch] = {}
        order: list[_PartitionBatch] = []
        partitions: dict[str, list[int]] = {}
        too_large: int | None = None
        for index, raw in enumerate(batch):
            value = raw.to_json()
            key = raw.stream.encode()
            headers = signed(message_headers(raw), value, self.settings.bus_signing_key)
            if _estimate_size(key, value, headers) > MAX_MESSAGE_BYTES:
                too_large = index
                break
            topic = self.topics.for_stream(raw.stream)
            known = partitions.get(topic)
            if known is None:
                known = partitions[topic] = list(await producer.partitions_for(topic))
            partition = self._partitioner(key, known, known)
            current = builders.get((topic, partition))
            if current is None or not current.add(key, value, headers):
                # A fresh record batch takes any first record, whatever its size.
                nth = 0 if current is None else current.nth + 1
                current = builders[(topic, partition)] = _PartitionBatch(
                    producer.create_batch(), topic, partition, index, nth
                )
                current.add(key, value, headers)
                order.append(current)
        # Every partition's first record batch before any second one: a partition's next
        # batch waits in send_batch until the one before it has been taken for sending.
        order.sort(key=lambda b: (b.nth, b.first))
        sends: list[asyncio.Future[Any] | BaseException] = []
        for part in order:
            try:
                sends.append(
                    await producer.send_batch(part.builder, part.topic, partition=part.partition)
                )
            except UNPUBLISHABLE as refused:
                sends.append(refused)
        outcomes = await _settled(sends)
        first_refused = too_large
        for part, outcome in zip(order, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                if not isinstance(outcome, UNPUBLISHABLE):
                    raise outcome
                if first_refused is None or part.first < first_refused:
                    first_refused = part.first
        return first_refused

    async def _send(self, producer: AIOKafkaProducer, raw: RawEvent) -> asyncio.Future[Any]:
        value = raw.to_json()
        future: asyncio.Future[Any] = await producer.send(
            self.topics.for_stream(raw.stream),
            value,
            key=raw.stream.encode(),
            headers=signed(message_headers(raw), value, self.settings.bus_signing_key),
        )
        return future

    async def _publish_one_by_one(self, rest: list[RawEvent]) -> AIOKafkaProducer:
        """The bus refused a record: the broker refuses a whole batch for one record in it, so
        publish the rest of the batch again one record at a time with a fresh producer (its
        sequence may be broken by the refusal); what is refused alone is dead-lettered. Records
        of the refused batches that were accepted are sent twice: consumers' inboxes absorb it."""
        await self._restart_producer()
        producer = await self._ensure_producer()
        for raw in rest:
            try:
                await (await self._send(producer, raw))
            except UNPUBLISHABLE as refused:
                await self._restart_producer()
                producer = await self._ensure_producer()
                await self.dead_letter(producer, raw, refused)
        return producer

    async def dead_letter(
        self, producer: AIOKafkaProducer, raw: RawEvent, refused: BaseException
    ) -> None:
        """Record that the bus refused `raw` and send a note of it (not the event itself,
        which the bus refuses) to the dead-letter topic: the relay goes on after it."""
        size = len(raw.to_json())
        reason = f"{type(refused).__name__}: {refused}"
        log.error(
            "relay %s: the bus refused %s at position %d (%d bytes): %s",
            self.name,
            raw.type,
            raw.position,
            size,
            reason,
        )
        async with self.store.pool.acquire() as c:
            await c.execute(
                _DEAD_LETTER,
                self.name,
                raw.position,
                raw.event_id,
                raw.stream,
                raw.type,
                size,
                reason,
            )
        note = json.dumps(
            {
                "position": raw.position,
                "event_id": str(raw.event_id),
                "stream": raw.stream,
                "type": raw.type,
                "size_bytes": size,
                "reason": reason,
            }
        ).encode()
        headers = [
            *message_headers(raw),
            ("deadletter.reason", reason.encode()),
            ("deadletter.consumer", f"relay:{self.name}".encode()),
            ("deadletter.position", str(raw.position).encode()),
        ]
        await producer.send_and_wait(
            self.topics.deadletter, note, key=raw.stream.encode(), headers=headers
        )
        self.dead_letters += 1
        self._dead_letters.inc()

    def readiness(self) -> tuple[bool, dict[str, Any]]:
        """For /readyz: not ready while the relay trails the log by more than the threshold."""
        detail = {
            "position": self.position,
            "lag": self.lag,
            "max_lag": self.settings.ready_max_lag_events,
            "dead_letters": self.dead_letters,
        }
        return self.lag <= self.settings.ready_max_lag_events, detail

    async def load_position(self) -> int:
        async with self.store.pool.acquire() as c:
            position = await c.fetchval(_LOAD, self.name)
        self._stored = 0 if position is None else int(position)
        return self._stored

    async def store_position(self, position: int) -> None:
        async with self.store.pool.acquire() as c:
            await c.execute(_STORE, self.name, position)
        self.position = self._stored = position
        self._stored_at = time.monotonic()

    def _store_due(self) -> float | None:
        """Seconds until the acknowledged position is due to be stored (0.0: now); None when
        relay_positions holds it already."""
        if self.position <= self._stored:
            return None
        return max(0.0, self._stored_at + POSITION_STORE_INTERVAL_S - time.monotonic())

    async def _wait_for_lock(self, conn: asyncpg.Connection, stop: asyncio.Event) -> bool:
        while not await conn.fetchval(_TRY_LOCK, self.name):
            if await sleep_unless(stop, self.settings.relay_poll_interval_s):
                return False
        return True

    def _on_notify(self, *_: Any) -> None:
        self._wake.set()

    async def _sleep_until_woken(self, stop: asyncio.Event, due: float | None = None) -> bool:
        """Until a notification, `stop`, or the poll interval (or `due` seconds, when sooner);
        whether anything woke it. NOTIFY wakes the relay at once; the poll is the fallback
        for a lost notification."""
        timeout = self.settings.relay_poll_interval_s
        waiters = {asyncio.ensure_future(self._wake.wait()), asyncio.ensure_future(stop.wait())}
        try:
            done, _ = await asyncio.wait(
                waiters,
                timeout=timeout if due is None else min(timeout, due),
                return_when=asyncio.FIRST_COMPLETED,
            )
        finally:
            for waiter in waiters:
                waiter.cancel()
        return bool(done)

    async def _ensure_producer(self) -> AIOKafkaProducer:
        if self._producer is None:
            # No linger: publish_pending queues a whole read of the log before awaiting any
            # of it, so the sends share requests anyway, and lingering only delays each hop.
            producer = make_producer(
                self.settings,
                client_id=f"{self.settings.service_name}-relay",
                linger_ms=0,
                partitioner=self._partitioner,
            )
            # Bounded, and stopped if it fails (with the broker away, each round's try was
            # left unstopped).
            self._producer = await start_producer(producer)
        return self._producer

    async def _restart_producer(self) -> None:
        # An idempotent producer whose batch failed may hold a broken sequence; start afresh.
        await self._stop_producer()

    async def _stop_producer(self) -> None:
        producer, self._producer = self._producer, None
        await stop_producer(producer)


_STATUS = """
SELECT (SELECT position FROM event_log_head),
       (SELECT position FROM relay_positions WHERE name = $1),
       (SELECT count(*) FROM relay_dead_letters WHERE relay = $1)
"""


async def log_identity(store: EventStore) -> str | None:
    """The first event's id: tells one log from another (`replay --verify` checks that the
    API it compares with serves the log it reads)."""
    async with store.pool.acquire() as c:
        first = await c.fetchval("SELECT event_id FROM events WHERE position = 1")
    return None if first is None else str(first)


async def relay_status(store: EventStore, name: str) -> dict[str, int]:
    """How far the relay `name` trails the log, and how many events the bus refused, from
    the database (for the API's /readyz, in another process than the relay)."""
    async with store.pool.acquire() as c:
        head, position, dead = await c.fetchrow(_STATUS, name)
    position = int(position or 0)
    return {"position": position, "lag": max(0, int(head) - position), "dead_letters": int(dead)}


async def _settled(sends: list[asyncio.Future[Any] | BaseException]) -> list[Any]:
    """Each send's outcome, in order: its result, its exception, or the exception it was
    refused with before it was queued. The futures are gathered as they are: a coroutine per
    send made a task per record, a tenth of the relay's CPU in a burst of batches."""
    queued = [send for send in sends if not isinstance(send, BaseException)]
    settled = iter(await asyncio.gather(*queued, return_exceptions=True))
    return [send if isinstance(send, BaseException) else next(settled) for send in sends]


async def _unless_stopped(work: Awaitable[T], stop: asyncio.Event) -> T | None:
    """`work`'s result, or None as soon as `stop` is set (then `work` is cancelled): a send
    waiting on an absent broker must not hold up a shutdown."""
    task = asyncio.ensure_future(work)
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({task, stopped}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
    return None if task.cancelled() else task.result()


async def main(settings: Settings | None = None) -> None:
    """`python -m services.runtime.relay`: migrate, then relay until SIGTERM."""
    from services.runtime.collector import settle_started_service
    from services.runtime.metrics import start_metrics_server
    from services.runtime.signals import stop_on_signals
    from services.runtime.startup import open_store

    settings = settings or Settings()
    stop = stop_on_signals()
    # Started while the database is away (a supervisor's restart during an outage): wait.
    store = await open_store(
        settings, producer=f"{settings.service_name}-relay", log=log, stop=stop, migrate=True
    )
    if store is None:
        return
    try:
        relay = OutboxRelay(store, settings)
        settle_started_service()
        port = os.environ.get("GANGWAY_METRICS_PORT")
        if port:
            start_metrics_server(int(port), relay.registry, ready=relay.readiness)
        await relay.run(stop)
    finally:
        await store.close()


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    asyncio.run(main())
