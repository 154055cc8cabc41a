"""The consumer runtime every service uses: batches, manual commits, inbox, dead letters.

The loop follows aiokafka's rules for consumers with a database: fetch with `getmany`, apply
each message in its own transaction, then commit offset + 1. A redelivered event is recognised
by its inbox row (written in the handler's transaction) and changes nothing. A message that can
never be processed goes to the dead-letter topic with the reason, and the loop goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import traceback
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from enum import Enum
from typing import Any
from uuid import UUID

import asyncpg
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord, TopicPartition
from aiokafka.errors import CommitFailedError, IllegalStateError, KafkaError
from pydantic import ValidationError

from schemas import REGISTRY, EventDecodeError, EventEnvelope, EventRegistry
from schemas.telemetry import TELEMETRY, NodeHeartbeat, StepTimeSample
from services.runtime.collector import collection_deferred
from services.runtime.errors import DATABASE_UNAVAILABLE, ConcurrencyConflict, DomainError
from services.runtime.kafka import make_consumer, make_producer, start_producer, stop_producer
from services.runtime.metrics import follow_readiness, unfollow_readiness
from services.runtime.retry import Outage
from services.runtime.settings import Settings
from services.runtime.signals import sleep_unless
from services.runtime.signing import signed, verify
from services.runtime.topics import Topics, ensure_topics

log = logging.getLogger(__name__)

EventHandler = Callable[[EventEnvelope, asyncpg.Connection], Awaitable[None]]
# Wraps the handling of one fetched batch: the handlers only stage their effects, and the scope
# writes them at its end, with each applied event's row in the inbox named by its second
# argument, in one statement of its own (admission appends a batch's decisions so): the batch
# runs outside a transaction, so that no COMMIT round trip is left inside the log's head lock,
# and a handler writes nothing through the connection but by staging. An applied event the
# scope could not write for (its stream moved on) gets its effects and its inbox row in a
# transaction of their own. A batch that fails leaves the scope with its exception and writes
# nothing. Given None for the inbox, the scope is inside a transaction that recorded the
# event's inbox row already (`EventConsumer.process`, one message) and writes the effects only.
BatchScope = Callable[[asyncpg.Connection, str | None], AbstractAsyncContextManager[None]]
TelemetryMessage = NodeHeartbeat | StepTimeSample
TelemetryHandler = Callable[[TelemetryMessage], Awaitable[None]]

# Worth retrying for as long as it takes: the database or the network will come back, and a
# concurrency conflict resolves when the handler reloads its stream.
TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (
    *DATABASE_UNAVAILABLE,  # a restart's AdminShutdownError too: never a dead letter
    asyncpg.SerializationError,
    asyncpg.DeadlockDetectedError,
    ConcurrencyConflict,
    KafkaError,
)

_INBOX = """
INSERT INTO inbox (consumer, event_id) VALUES ($1, $2)
ON CONFLICT (consumer, event_id) DO NOTHING
RETURNING true
"""

# The whole batch's inbox rows in one statement; returns the ids not seen before.
_INBOX_MANY = """
INSERT INTO inbox (consumer, event_id) SELECT $1, id FROM unnest($2::uuid[]) AS u(id)
ON CONFLICT (consumer, event_id) DO NOTHING
RETURNING event_id
"""

# The ids of the batch not in the inbox yet, written by nothing here (a BatchScope writes them
# with the effects).
_INBOX_UNSEEN = """
SELECT u.id FROM unnest($2::uuid[]) AS u(id)
WHERE NOT EXISTS (SELECT 1 FROM inbox i WHERE i.consumer = $1 AND i.event_id = u.id)
"""


class Outcome(Enum):
    APPLIED = "applied"
    DUPLICATE = "duplicate"
    SKIPPED = "skipped"
    DEAD_LETTERED = "dead-lettered"


class Unprocessable(Exception):
    """A message that no retry can fix; carries the reason for the dead-letter topic."""


class ConsumerLoop(ABC):
    """Fetch, process one message at a time, dead-letter the unprocessable, commit.

    Subclasses say how one message is processed (`process`); the loop owns retries,
    dead letters, commits and shutdown.
    """

    def __init__(
        self,
        settings: Settings,
        *,
        name: str,
        topics: Sequence[str],
        commit_interval_s: float = 0.0,
    ) -> None:
        self.settings = settings
        self.name = name
        self.topics = tuple(topics)
        # Offsets are committed at most this often (0: after every batch). A consumer whose
        # effects make a redelivery a no-op (an inbox, versioned read models) spares a round
        # trip to the group coordinator per batch; a restart or a rebalance then re-reads, as
        # no-ops, what was applied since the last commit. What is applied is committed on stop.
        self.commit_interval_s = commit_interval_s
        self._uncommitted: dict[TopicPartition, int] = {}
        self._committed_at = 0.0
        self.bus_topics = Topics.from_settings(settings)
        self.counts: dict[Outcome, int] = dict.fromkeys(Outcome, 0)
        self._consumer: AIOKafkaConsumer | None = None
        self._producer: AIOKafkaProducer | None = None
        self.started = asyncio.Event()
        # Records on its partitions not yet processed, as of the last fetch (/readyz reads it).
        self.lag = 0

    @property
    def max_lag(self) -> int:
        """The lag past which /readyz of the process says not ready."""
        return self.settings.ready_max_lag_events

    @abstractmethod
    async def process(self, record: ConsumerRecord[bytes, bytes]) -> Outcome:
        """Apply one message. Raise Unprocessable or DomainError for dead letters."""

    async def run(self, stop: asyncio.Event) -> None:
        """Consume until `stop` is set, then commit what was applied and leave the group."""
        clients = await self._connect(stop)
        if clients is None:
            return
        consumer, producer = clients
        self._consumer, self._producer = consumer, producer
        follow_readiness(self)
        # Per partition, the offset of the first record not processed yet.
        unprocessed: dict[TopicPartition, int] = {}
        self._committed_at = time.monotonic()  # the group resumed from its committed offsets
        try:
            while not stop.is_set():
                batches = await consumer.getmany(
                    timeout_ms=200, max_records=self.settings.consumer_max_batch
                )
                if not self.started.is_set() and consumer.assignment():
                    self.started.set()
                for tp, records in batches.items():
                    if records:
                        unprocessed[tp] = records[0].offset
                self.lag = _lag(consumer, unprocessed)
                done = {}
                if batches:
                    with collection_deferred():
                        done = await self._process_batch(batches, stop)
                if done:
                    # One commit for every partition of the batch: each one's effects are
                    # durable already, and one round trip to the coordinator is all it takes.
                    await self._commit_due(consumer, done)
                unprocessed.update(done)
                self.lag = _lag(consumer, unprocessed)
        finally:
            unfollow_readiness(self)
            # The dead letters' producer may have been replaced, or dropped, since.
            dead_letters = self._producer
            self._consumer = self._producer = None
            if self._uncommitted:
                # Bounded: with the broker away the next owner re-reads them, as no-ops.
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(self._commit(consumer, self._uncommitted), 2.0)
                self._uncommitted = {}
            await consumer.stop()
            await stop_producer(dead_letters)

    async def _connect(
        self, stop: asyncio.Event
    ) -> tuple[AIOKafkaConsumer, AIOKafkaProducer] | None:
        """Started clients, however long the broker takes to be reachable (None: stopped
        first). The group then resumes from its committed offsets."""
        outage = Outage(log, f"{self.name}: the bus")
        while not stop.is_set():
            consumer = make_consumer(
                self.settings,
                *self.topics,
                # Group ids are broker-wide: the prefix keeps a test run's consumers out of the
                # groups of the `make up` services on the same broker (the inbox keeps `name`).
                group_id=f"{self.settings.topic_prefix}.{self.name}",
                client_id=f"{self.settings.service_name}-{self.name}",
            )
            producer = make_producer(self.settings, client_id=f"{self.settings.service_name}-dlq")
            try:
                await ensure_topics(self.settings, self.bus_topics)
                await consumer.start()
                await producer.start()
            except (KafkaError, OSError, TimeoutError) as error:
                for client in (consumer, producer):
                    with contextlib.suppress(Exception):
                        await asyncio.wait_for(client.stop(), 2.0)
                if await outage.sleep(error, stop):
                    return None
                continue
            outage.recovered()
            return consumer, producer
        return None

    async def _process_batch(
        self,
        batches: Mapping[TopicPartition, Sequence[ConsumerRecord[bytes, bytes]]],
        stop: asyncio.Event,
    ) -> dict[TopicPartition, int]:
        """Process each partition's records in order; return, per partition, the offset to
        commit (the one after the last message done with)."""
        done: dict[TopicPartition, int] = {}
        for tp, records in batches.items():
            for record in records:
                outcome = await self._process_with_retries(record, stop)
                if outcome is None:
                    # Stopping mid-retry: leave the message uncommitted for the next owner.
                    return done
                self.counts[outcome] += 1
                done[tp] = record.offset + 1
        return done

    async def _process_with_retries(
        self, record: ConsumerRecord[bytes, bytes], stop: asyncio.Event
    ) -> Outcome | None:
        failures = 0
        backoff = 0.05
        while True:
            reason: str | None = None
            try:
                return await self.process(record)
            except (Unprocessable, DomainError) as error:
                reason = f"{type(error).__name__}: {error}"
            except TRANSIENT_ERRORS as error:
                log.warning("%s: transient %r at %s; retrying", self.name, error, _where(record))
            except Exception as error:
                failures += 1
                if failures >= self.settings.consumer_max_attempts:
                    reason = f"handler failed {failures} times: {error!r}\n" + "".join(
                        traceback.format_exception(error)[-3:]
                    )
                else:
                    log.warning(
                        "%s: %r at %s (attempt %d)", self.name, error, _where(record), failures
                    )
            if reason is not None:
                return await self._dead_letter_until_sent(record, reason, stop)
            if await sleep_unless(stop, backoff):
                return None
            backoff = min(backoff * 2, 5.0)

    async def _dead_letter_until_sent(
        self, record: ConsumerRecord[bytes, bytes], reason: str, stop: asyncio.Event
    ) -> Outcome | None:
        backoff = 0.1
        while True:
            try:
                await self.dead_letter(record, reason)
                return Outcome.DEAD_LETTERED
            except (KafkaError, OSError) as error:
                log.warning("%s: dead letter not sent: %r; retrying", self.name, error)
                # With a fresh producer (kafka.start_producer says why): the one whose send
                # failed may never be accepted again, and this partition would stall behind it.
                await stop_producer(self._producer)
                self._producer = None
            if await sleep_unless(stop, backoff):
                return None
            backoff = min(backoff * 2, 5.0)

    async def dead_letter(self, record: ConsumerRecord[bytes, bytes], reason: str) -> None:
        """Publish the message as received, with why and where from, before its offset is
        committed: a dead letter is never lost."""
        if self._producer is None:
            self._producer = await start_producer(
                make_producer(self.settings, client_id=f"{self.settings.service_name}-dlq")
            )
        log.error("%s: dead-lettering %s: %s", self.name, _where(record), reason.splitlines()[0])
        headers = [
            *[(k, v) for k, v in (record.headers or ()) if not k.startswith("deadletter.")],
            ("deadletter.reason", reason.encode()),
            ("deadletter.consumer", self.name.encode()),
            ("deadletter.topic", record.topic.encode()),
            ("deadletter.partition", str(record.partition).encode()),
            ("deadletter.offset", str(record.offset).encode()),
        ]
        await self._producer.send_and_wait(
            self.bus_topics.deadletter, record.value, key=record.key, headers=headers
        )

    async def _commit_due(
        self, consumer: AIOKafkaConsumer, offsets: dict[TopicPartition, int]
    ) -> None:
        self._uncommitted.update(offsets)
        now = time.monotonic()
        if now - self._committed_at < self.commit_interval_s:
            return
        self._committed_at = now
        due, self._uncommitted = self._uncommitted, {}
        await self._commit(consumer, due)

    async def _commit(self, consumer: AIOKafkaConsumer, offsets: dict[TopicPartition, int]) -> None:
        # Offsets kept since the last commit (`commit_interval_s`) may name a partition that a
        # rebalance has given to another member meanwhile: aiokafka refuses the whole commit
        # with IllegalStateError (not CommitFailedError), which ended the service. The new
        # owner re-reads from the last commit, and the inbox turns the repeats into no-ops.
        assigned = consumer.assignment()
        offsets = {tp: offset for tp, offset in offsets.items() if tp in assigned}
        if not offsets:
            return
        try:
            await consumer.commit(offsets)
        except (CommitFailedError, IllegalStateError) as error:
            # A partition moved to another member during a rebalance (or one is under way);
            # it will re-read from the last commit and the inbox turns the repeats into no-ops.
            log.warning("%s: commit of %s failed: %r", self.name, offsets, error)


def check_signature(
    record: ConsumerRecord[bytes, bytes], envelope: EventEnvelope, settings: Settings
) -> None:
    """Only the log speaks: a record acts only if the relay signed it (runtime/signing.py) and
    its headers name the position and event id its signed body holds. Raises Unprocessable
    (the record is dead-lettered) otherwise."""
    assert record.value is not None
    forged = verify(record.headers, record.value, settings.bus_signing_key)
    if forged is None:
        position, event_id = _header(record, "position"), _header(record, "event_id")
        if position != str(envelope.position) or event_id != str(envelope.event_id):
            forged = "its headers do not name the position and event id of its body"
    if forged is not None:
        raise Unprocessable(f"{envelope.type} at position {envelope.position}: {forged}")


class EventConsumer(ConsumerLoop):
    """Consumes log events from the bus and hands each to the handler for its type.

    A handler receives the decoded envelope and a connection inside the transaction that also
    records the event in the inbox: whatever it writes with that connection (read models,
    appended events) happens exactly once per event.
    """

    def __init__(
        self,
        settings: Settings,
        pool: asyncpg.Pool,
        *,
        name: str,
        topics: Sequence[str],
        handlers: Mapping[str, EventHandler],
        registry: EventRegistry = REGISTRY,
        batch_scope: BatchScope | None = None,
        commit_interval_s: float = 0.0,
    ) -> None:
        super().__init__(settings, name=name, topics=topics, commit_interval_s=commit_interval_s)
        self.batch_scope = batch_scope
        unknown = [t for t in handlers if t not in registry.types]
        if unknown:
            raise ValueError(f"handlers for unregistered event types: {unknown}")
        self.pool = pool
        self.handlers = dict(handlers)
        self.registry = registry

    def decode(self, record: ConsumerRecord[bytes, bytes]) -> EventEnvelope | None:
        """The envelope to hand to a handler, or None when no handler wants it."""
        declared = _header(record, "type")
        if declared is not None and declared not in self.handlers:
            return None  # not ours; no need to parse it
        if record.value is None:
            raise Unprocessable("message has no value")
        try:
            envelope = EventEnvelope.from_json(record.value, self.registry)
        except EventDecodeError as error:
            raise Unprocessable(f"undecodable event: {error}") from error
        if envelope.type not in self.handlers:
            return None
        check_signature(record, envelope, self.settings)
        return envelope

    async def process(self, record: ConsumerRecord[bytes, bytes]) -> Outcome:
        envelope = self.decode(record)
        if envelope is None:
            return Outcome.SKIPPED
        async with (
            self.pool.acquire() as conn,
            conn.transaction(),
            (self.batch_scope or _no_scope)(conn, None),
        ):
            return await self._apply(conn, envelope)

    async def _apply(self, conn: asyncpg.Connection, envelope: EventEnvelope) -> Outcome:
        if not await record_in_inbox(conn, self.name, envelope.event_id):
            return Outcome.DUPLICATE
        await self.handlers[envelope.type](envelope, conn)
        return Outcome.APPLIED

    async def _process_batch(
        self,
        batches: Mapping[TopicPartition, Sequence[ConsumerRecord[bytes, bytes]]],
        stop: asyncio.Event,
    ) -> dict[TopicPartition, int]:
        """Apply the fetched batch, every partition's records in their order, in one
        transaction (or, with a batch scope, in the scope's one statement): one commit (one WAL
        flush) and one inbox statement for many events. An event its handler refuses undoes
        the batch; it is then applied again without it."""
        staged: list[_Staged] = []
        for tp, records in batches.items():
            for record in records:
                try:
                    staged.append(_Staged(tp, record, self.decode(record)))
                except Unprocessable as error:
                    staged.append(_Staged(tp, record, None, f"Unprocessable: {error}"))
        failures: dict[int, int] = {}
        backoff = 0.05
        while True:
            try:
                outcomes = await self._apply_batch(staged)
                break
            except _Refused as refused:
                staged[refused.index].reason = refused.reason
                continue
            except _RetryBatch as retry:
                failures[retry.index] = failures.get(retry.index, 0) + 1
                cause = retry.__cause__
                assert cause is not None
                if failures[retry.index] >= self.settings.consumer_max_attempts:
                    staged[retry.index].reason = (
                        f"handler failed {failures[retry.index]} times: {cause!r}\n"
                        + "".join(traceback.format_exception(cause)[-3:])
                    )
                    continue
                log.warning("%s: %r; retrying the batch", self.name, cause)
            except TRANSIENT_ERRORS as transient:
                log.warning("%s: transient %r; retrying the batch", self.name, transient)
            if await sleep_unless(stop, backoff):
                return {}  # nothing of this batch committed; it will be read again
            backoff = min(backoff * 2, 5.0)
        done: dict[TopicPartition, int] = {}
        for item, outcome in zip(staged, outcomes, strict=True):
            if item.reason is not None:
                sent = await self._dead_letter_until_sent(item.record, item.reason, stop)
                if sent is None:
                    # The effects after it are committed; their redelivery is a no-op (inbox).
                    return done
            self.counts[outcome] += 1
            done[item.partition] = item.record.offset + 1
        return done

    async def _apply_batch(self, staged: Sequence[_Staged]) -> list[Outcome]:
        todo = [s.envelope.event_id for s in staged if s.envelope is not None and not s.reason]
        outcomes: list[Outcome] = []
        async with contextlib.AsyncExitStack() as scope:
            conn = await scope.enter_async_context(self.pool.acquire())
            if self.batch_scope is None:
                await scope.enter_async_context(conn.transaction())
                inbox = _INBOX_MANY  # written here, in the handlers' transaction
            else:
                inbox = _INBOX_UNSEEN  # written by the batch scope, with the effects
                await scope.enter_async_context(self.batch_scope(conn, self.name))
            fresh = {r[0] for r in await conn.fetch(inbox, self.name, todo)} if todo else set()
            for index, item in enumerate(staged):
                if item.reason is not None:
                    outcomes.append(Outcome.DEAD_LETTERED)
                elif item.envelope is None:
                    outcomes.append(Outcome.SKIPPED)
                elif item.envelope.event_id not in fresh:
                    outcomes.append(Outcome.DUPLICATE)
                else:
                    fresh.discard(item.envelope.event_id)  # a second copy in this batch
                    try:
                        await self.handlers[item.envelope.type](item.envelope, conn)
                    except DomainError as error:
                        raise _Refused(index, f"DomainError: {error}") from error
                    except TRANSIENT_ERRORS:
                        raise
                    except Exception as error:
                        raise _RetryBatch(index) from error
                    outcomes.append(Outcome.APPLIED)
        return outcomes


async def record_in_inbox(conn: asyncpg.Connection, consumer: str, event_id: UUID) -> bool:
    """Record that `consumer` handled `event_id`, in the caller's transaction with the
    handling's effects; False when it was recorded before (a redelivery)."""
    return bool(await conn.fetchval(_INBOX, consumer, event_id))


@contextlib.asynccontextmanager
async def _no_scope(_conn: asyncpg.Connection, _inbox: str | None) -> AsyncIterator[None]:
    yield


@dataclass(slots=True)
class _Staged:
    partition: TopicPartition
    record: ConsumerRecord[bytes, bytes]
    envelope: EventEnvelope | None
    reason: str | None = None  # set: the message goes to the dead letters


class _Refused(Exception):
    def __init__(self, index: int, reason: str) -> None:
        super().__init__(reason)
        self.index = index
        self.reason = reason


class _RetryBatch(Exception):
    """A handler failed in a way that may pass: undo the whole batch and apply it again."""

    def __init__(self, index: int) -> None:
        super().__init__(index)
        self.index = index


class TelemetryConsumer(ConsumerLoop):
    """Consumes heartbeats and samples from the telemetry topic (not events: no inbox)."""

    def __init__(
        self,
        settings: Settings,
        *,
        name: str,
        handler: TelemetryHandler,
        topics: Sequence[str] | None = None,
    ) -> None:
        super().__init__(
            settings, name=name, topics=topics or [Topics.from_settings(settings).telemetry]
        )
        self.handler = handler

    async def process(self, record: ConsumerRecord[bytes, bytes]) -> Outcome:
        if record.value is None:
            raise Unprocessable("message has no value")
        # An agent's, or nobody's: a forged heartbeat must not keep a dead node alive, nor a
        # forged XID drain a healthy one.
        forged = verify(record.headers, record.value, self.settings.bus_signing_key)
        if forged is not None:
            raise Unprocessable(f"telemetry refused: {forged}")
        try:
            message = TELEMETRY.validate_json(record.value)
        except ValidationError as error:
            raise Unprocessable(f"undecodable telemetry: {error}") from error
        await self.handler(message)
        return Outcome.APPLIED


def telemetry_record(
    message: TelemetryMessage, key: bytes
) -> tuple[bytes, list[tuple[str, bytes]]]:
    """A heartbeat's or sample's value and headers, signed with the services' key (the
    telemetry consumers act on nothing else)."""
    value = message.model_dump_json().encode()
    return value, signed([], value, key)


async def publish_telemetry(
    producer: AIOKafkaProducer, topics: Topics, message: TelemetryMessage, *, key: bytes
) -> None:
    """Send a heartbeat or sample, signed, keyed by node so that each node's samples stay in
    order."""
    value, headers = telemetry_record(message, key)
    await producer.send_and_wait(
        topics.telemetry, value, key=message.node_id.encode(), headers=headers
    )


def _header(record: ConsumerRecord[Any, Any], name: str) -> str | None:
    for key, value in record.headers or ():
        if key == name:
            try:
                return bytes(value).decode()
            except UnicodeDecodeError:
                return None
    return None


def _lag(consumer: AIOKafkaConsumer, unprocessed: dict[TopicPartition, int]) -> int:
    """Records not processed yet, up to the partitions' high watermarks as the last fetches
    reported them."""
    lag = 0
    for tp in consumer.assignment():
        highwater = consumer.highwater(tp)
        if highwater is not None and tp in unprocessed:
            lag += max(0, highwater - unprocessed[tp])
    return lag


def _where(record: ConsumerRecord[Any, Any]) -> str:
    return f"{record.topic}[{record.partition}]@{record.offset}"


async def wait_started(loop: ConsumerLoop, task: asyncio.Task[None]) -> None:
    """Return once `loop` (running as `task`) has its partitions, or has ended; raise if the
    task failed first.

    A service announces itself ready only then: before it, messages published now might be
    read by nobody. A loop that ended without failing was stopped on request (it only returns
    then), which may come before the group assigned it anything: a shutdown, not an error.
    """
    started = asyncio.create_task(loop.started.wait())
    try:
        await asyncio.wait({started, task}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        started.cancel()
    if task.done():
        task.result()
