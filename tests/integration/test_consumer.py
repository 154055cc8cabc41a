"""The consumer runtime against the real Kafka and PostgreSQL."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import asyncpg
import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.errors import OutOfOrderSequenceNumber

import services.runtime.consumer as consumer_module
from schemas import EventEnvelope
from schemas.telemetry import NodeHeartbeat
from services.runtime import (
    DomainError,
    EventConsumer,
    EventStore,
    Outcome,
    RawEvent,
    Settings,
    TelemetryConsumer,
    Topics,
    ensure_topics,
    make_producer,
    publish_telemetry,
)
from services.runtime.consumer import wait_started
from services.runtime.relay import message_headers
from services.runtime.signing import signed
from tests.integration.support import (
    count_effects,
    create_effects_table,
    deferrals,
    header,
    read_topics,
    running,
    wait_until,
)

pytestmark = pytest.mark.integration


@pytest.fixture
async def producer(settings: Settings) -> AsyncIterator[AIOKafkaProducer]:
    await ensure_topics(settings)
    kafka = make_producer(settings)
    await kafka.start()
    yield kafka
    await kafka.stop()


@pytest.fixture
async def pool(store: EventStore) -> asyncpg.Pool:
    return store.pool


async def _recorded(store: EventStore, stream: str, count: int) -> list[RawEvent]:
    await store.append(stream, None, deferrals(stream.removeprefix("job-"), count))
    return [r for r in await store.read_all_raw(0, 10_000) if r.stream == stream]


async def _publish(
    producer: AIOKafkaProducer, topics: Topics, raws: list[RawEvent], key: bytes
) -> None:
    """Publish as the relay does, signed with the services' key."""
    for raw in raws:
        value = raw.to_json()
        await producer.send_and_wait(
            topics.for_stream(raw.stream),
            value,
            key=raw.stream.encode(),
            headers=signed(message_headers(raw), value, key),
        )


async def _effects(store: EventStore) -> dict[int, int]:
    async with store.pool.acquire() as c:
        return {r["version"]: r["times"] for r in await c.fetch("SELECT * FROM effects")}


async def _effects_consumer(settings: Settings, store: EventStore, topics: Topics) -> EventConsumer:
    """A consumer of the jobs topic that counts each JobDeferred it applies (`_effects`)."""
    await create_effects_table(settings)
    return EventConsumer(
        settings,
        store.pool,
        name="effects",
        topics=[topics.jobs],
        handlers={"JobDeferred": count_effects},
    )


async def test_a_malformed_message_is_dead_lettered_with_its_reason_and_the_consumer_goes_on(
    settings: Settings, store: EventStore, topics: Topics, producer: AIOKafkaProducer
) -> None:
    consumer = await _effects_consumer(settings, store, topics)
    good = await _recorded(store, "job-a", 2)
    not_json = b"\xff{not json"
    unknown_type = json.dumps({"type": "NoSuchEvent", "schema_version": 1, "payload": {}}).encode()

    async with running(consumer):
        await _publish(producer, topics, good[:1], settings.bus_signing_key)
        await producer.send_and_wait(topics.jobs, not_json, key=b"job-a")
        await producer.send_and_wait(topics.jobs, unknown_type, key=b"job-a")
        await _publish(producer, topics, good[1:], settings.bus_signing_key)

        async def both_good_events_applied() -> bool:
            return await _effects(store) == {1: 1, 2: 1}

        await wait_until(both_good_events_applied, what="the events around the bad ones applied")

    dead = await read_topics(settings, [topics.deadletter], 2)
    assert sorted(d.value for d in dead) == sorted([not_json, unknown_type])
    reasons = {d.value: header(d, "deadletter.reason") or "" for d in dead}
    assert "not JSON" in reasons[not_json]
    assert "unknown event type 'NoSuchEvent'" in reasons[unknown_type]
    assert {header(d, "deadletter.topic") for d in dead} == {topics.jobs}
    assert consumer.counts[Outcome.DEAD_LETTERED] == 2


class RefusedSequence:
    """A started producer as aiokafka leaves an idempotent one when a restarted broker lost the
    tail of its log: every later batch of its partitions is refused (OutOfOrderSequenceNumber)
    and the sequence is never reset, so no send of it succeeds again."""

    def __init__(self, producer: AIOKafkaProducer) -> None:
        self._producer = producer

    async def start(self) -> None:
        await self._producer.start()

    async def stop(self) -> None:
        await self._producer.stop()

    async def send_and_wait(self, *args: object, **kwargs: object) -> None:
        raise OutOfOrderSequenceNumber()


async def test_dead_letters_reach_the_bus_again_after_a_producer_the_broker_refuses(
    settings: Settings,
    store: EventStore,
    topics: Topics,
    producer: AIOKafkaProducer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A consumer retried its dead letter on the one producer whose sequence the broker
    refused, forever: the partition stalled behind the malformed message."""
    made: list[object] = []

    def dead_letter_producer(*args: Any, **kwargs: Any) -> AIOKafkaProducer | RefusedSequence:
        made.append(None)
        real = make_producer(*args, **kwargs)
        return RefusedSequence(real) if len(made) == 1 else real

    monkeypatch.setattr(consumer_module, "make_producer", dead_letter_producer)
    consumer = await _effects_consumer(settings, store, topics)
    good = await _recorded(store, "job-q", 1)
    not_json = b"\xff{not json"

    async with running(consumer):
        await producer.send_and_wait(topics.jobs, not_json, key=b"job-q")
        await _publish(producer, topics, good, settings.bus_signing_key)
        # The batch's effects commit before its dead letters are sent: the letter is the proof.
        [dead] = await read_topics(settings, [topics.deadletter], 1)

    assert dead.value == not_json
    assert await _effects(store) == {1: 1}
    assert len(made) == 2
    assert consumer.counts[Outcome.DEAD_LETTERED] == 1


async def test_an_event_its_handler_refuses_is_dead_lettered_and_its_effects_rolled_back(
    settings: Settings, store: EventStore, topics: Topics, producer: AIOKafkaProducer
) -> None:
    await create_effects_table(settings)

    async def refuse_the_first(envelope: EventEnvelope, conn: asyncpg.Connection) -> None:
        await count_effects(envelope, conn)
        if envelope.version == 1:
            raise DomainError("version 1 is not welcome here")

    consumer = EventConsumer(
        settings,
        store.pool,
        name="picky",
        topics=[topics.jobs],
        handlers={"JobDeferred": refuse_the_first},
    )
    events = await _recorded(store, "job-p", 2)

    async with running(consumer):
        await _publish(producer, topics, events, settings.bus_signing_key)

        async def second_applied() -> bool:
            return await _effects(store) == {2: 1}

        await wait_until(second_applied, what="the second event applied")

    [dead] = await read_topics(settings, [topics.deadletter], 1)
    assert dead.value == events[0].to_json()
    assert header(dead, "deadletter.reason") == "DomainError: version 1 is not welcome here"
    async with store.pool.acquire() as c:
        inbox = await c.fetch("SELECT event_id FROM inbox WHERE consumer = 'picky'")
    assert [r["event_id"] for r in inbox] == [events[1].event_id]


async def test_a_redelivered_event_changes_nothing(
    settings: Settings, store: EventStore, topics: Topics, producer: AIOKafkaProducer
) -> None:
    await create_effects_table(settings)
    consumer = EventConsumer(
        settings,
        store.pool,
        name="once",
        topics=[topics.jobs],
        handlers={"JobDeferred": count_effects},
    )
    events = await _recorded(store, "job-d", 3)

    async with running(consumer):
        await _publish(producer, topics, events, settings.bus_signing_key)
        await _publish(producer, topics, events, settings.bus_signing_key)

        async def all_seen_twice() -> bool:
            return consumer.counts[Outcome.DUPLICATE] == 3

        await wait_until(all_seen_twice, what="the copies reached the consumer")

    assert await _effects(store) == {1: 1, 2: 1, 3: 1}
    assert consumer.counts[Outcome.APPLIED] == 3


# 0: a commit after every batch; an hour: none while it runs, what it applied on its stop.
@pytest.mark.parametrize("commit_interval_s", [0.0, 3600.0])
async def test_a_restarted_consumer_resumes_after_what_it_committed(
    settings: Settings,
    store: EventStore,
    topics: Topics,
    producer: AIOKafkaProducer,
    commit_interval_s: float,
) -> None:
    await create_effects_table(settings)
    events = await _recorded(store, "job-r", 6)

    def consumer() -> EventConsumer:
        return EventConsumer(
            settings,
            store.pool,
            name="resumer",
            topics=[topics.jobs],
            handlers={"JobDeferred": count_effects},
            commit_interval_s=commit_interval_s,
        )

    first = consumer()
    async with running(first):
        await _publish(producer, topics, events[:4], settings.bus_signing_key)

        async def four_applied() -> bool:
            return first.counts[Outcome.APPLIED] == 4

        await wait_until(four_applied, what="the first four applied")

    second = consumer()
    async with running(second):
        await _publish(producer, topics, events[4:], settings.bus_signing_key)

        async def all_applied() -> bool:
            return len(await _effects(store)) == 6

        await wait_until(all_applied, what="the last two applied")

    assert (second.counts[Outcome.APPLIED], second.counts[Outcome.DUPLICATE]) == (2, 0)


async def test_events_without_a_handler_are_skipped_and_committed(
    settings: Settings, store: EventStore, topics: Topics, producer: AIOKafkaProducer
) -> None:
    await create_effects_table(settings)
    consumer = EventConsumer(
        settings,
        store.pool,
        name="uninterested",
        topics=[topics.jobs],
        handlers={"JobSubmitted": count_effects},
    )
    events = await _recorded(store, "job-s", 3)

    async with running(consumer):
        await _publish(producer, topics, events, settings.bus_signing_key)

        async def all_skipped() -> bool:
            return consumer.counts[Outcome.SKIPPED] == 3

        await wait_until(all_skipped, what="the events skipped")

    assert await _effects(store) == {}


async def test_telemetry_reaches_its_handler_and_malformed_samples_are_dead_lettered(
    settings: Settings, topics: Topics, producer: AIOKafkaProducer
) -> None:
    received: list[str] = []

    async def remember(message: object) -> None:
        assert isinstance(message, NodeHeartbeat)
        received.append(message.node_id)

    consumer = TelemetryConsumer(settings, name="telemetry", handler=remember)
    beat = NodeHeartbeat(node_id="n1", at=datetime(2026, 1, 1, tzinfo=UTC))

    async with running(consumer):
        # Signed by an agent (the telemetry consumer reads nothing else), yet not telemetry.
        malformed = b'{"kind": "heartbeat"}'
        await producer.send_and_wait(
            topics.telemetry,
            malformed,
            key=b"n1",
            headers=signed([], malformed, settings.bus_signing_key),
        )
        await publish_telemetry(producer, topics, beat, key=settings.bus_signing_key)

        async def heartbeat_handled() -> bool:
            return received == ["n1"]

        await wait_until(heartbeat_handled, what="the heartbeat handled")

    [dead] = await read_topics(settings, [topics.deadletter], 1)
    assert "undecodable telemetry" in (header(dead, "deadletter.reason") or "")


async def test_an_event_whose_handler_keeps_failing_is_dead_lettered_after_its_attempts(
    settings: Settings, store: EventStore, topics: Topics, producer: AIOKafkaProducer
) -> None:
    await create_effects_table(settings)
    attempts: dict[int, int] = {}

    async def broken_on_the_second(envelope: EventEnvelope, conn: asyncpg.Connection) -> None:
        attempts[envelope.version] = attempts.get(envelope.version, 0) + 1
        await count_effects(envelope, conn)
        if envelope.version == 2:
            raise KeyError("a bug, not a refusal")

    consumer = EventConsumer(
        settings,
        store.pool,
        name="flaky",
        topics=[topics.jobs],
        handlers={"JobDeferred": broken_on_the_second},
    )
    events = await _recorded(store, "job-k", 3)

    async with running(consumer):
        await _publish(producer, topics, events, settings.bus_signing_key)

        async def others_applied() -> bool:
            return await _effects(store) == {1: 1, 3: 1}

        await wait_until(others_applied, what="the events around the broken one applied")

    [dead] = await read_topics(settings, [topics.deadletter], 1)
    assert dead.value == events[1].to_json()
    reason = header(dead, "deadletter.reason") or ""
    assert reason.startswith(f"handler failed {settings.consumer_max_attempts} times: KeyError")
    assert attempts[2] == settings.consumer_max_attempts


async def test_a_consumer_stopped_before_its_partitions_came_is_a_shutdown_not_a_failure(
    settings: Settings,
) -> None:
    async def ignore(message: object) -> None:
        return None

    consumer = TelemetryConsumer(settings, name="telemetry", handler=ignore)
    stop = asyncio.Event()
    stop.set()
    task = asyncio.create_task(consumer.run(stop))

    await wait_started(consumer, task)

    assert task.done() and not consumer.started.is_set()


async def test_waiting_for_a_consumer_that_failed_raises_its_error(settings: Settings) -> None:
    consumer = TelemetryConsumer(settings, name="telemetry", handler=lambda _: asyncio.sleep(0))

    async def fail() -> None:
        raise ConnectionError("broker unreachable")

    with pytest.raises(ConnectionError, match="broker unreachable"):
        await wait_started(consumer, asyncio.create_task(fail()))


async def test_a_session_ended_by_the_server_is_retried_until_it_passes_never_dead_lettered(
    settings: Settings, store: EventStore, topics: Topics, producer: AIOKafkaProducer
) -> None:
    await create_effects_table(settings)
    kills = 0

    async def on_a_restarting_database(envelope: EventEnvelope, conn: asyncpg.Connection) -> None:
        nonlocal kills
        if kills < 5:  # more than consumer_max_attempts: a crash would have become a dead letter
            kills += 1
            # What a database restart answers a statement in flight (SQLSTATE 57P01).
            await conn.execute(
                "DO $$ BEGIN RAISE EXCEPTION 'terminating connection due to administrator"
                " command' USING ERRCODE = 'admin_shutdown'; END $$"
            )
        await count_effects(envelope, conn)

    consumer = EventConsumer(
        settings,
        store.pool,
        name="restarts",
        topics=[topics.jobs],
        handlers={"JobDeferred": on_a_restarting_database},
    )
    events = await _recorded(store, "job-r", 1)
    async with running(consumer) as task:
        await _publish(producer, topics, events, settings.bus_signing_key)

        async def applied() -> bool:
            return await _effects(store) == {1: 1}

        await wait_until(applied, what="the event applied once the sessions held")
        assert not task.done()
    assert kills == 5
    assert consumer.counts[Outcome.DEAD_LETTERED] == 0
    assert consumer.counts[Outcome.APPLIED] == 1
