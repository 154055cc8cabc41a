"""A Kafka broker restart under running producers and consumers loses nothing acknowledged."""

from __future__ import annotations

import asyncio

import pytest
from aiokafka.errors import KafkaError

from services.runtime import (
    EventConsumer,
    EventStore,
    OutboxRelay,
    Settings,
    Topics,
    ensure_topics,
    make_producer,
)
from tests.integration.conftest import Stack
from tests.integration.support import (
    count_effects,
    create_effects_table,
    deferrals,
    read_topics,
    running,
    wait_until,
)

pytestmark = pytest.mark.integration


@pytest.fixture
def local_broker(stack: Stack) -> Stack:
    if not stack.kafka_is_local:
        pytest.skip("the broker at GANGWAY_KAFKA_BOOTSTRAP is not ours to restart")
    return stack


async def test_messages_acknowledged_before_a_broker_restart_survive_it(
    local_broker: Stack, settings: Settings, topics: Topics
) -> None:
    await ensure_topics(settings)
    acknowledged: list[bytes] = []
    acknowledged_after_restart = 0
    restarted = asyncio.Event()

    async def produce() -> None:
        nonlocal acknowledged_after_restart
        producer = make_producer(settings)
        await producer.start()
        try:
            i = 0
            while acknowledged_after_restart < 50:
                value = f"m{i}".encode()
                try:
                    await producer.send_and_wait(topics.telemetry, value, key=b"k")
                    acknowledged.append(value)
                    acknowledged_after_restart += restarted.is_set()
                except KafkaError:
                    pass  # not acknowledged: the producer may drop it, and so may we
                i += 1
                await asyncio.sleep(0.005)
        finally:
            await producer.stop()

    producing = asyncio.create_task(produce())

    async def some_acknowledged() -> bool:
        return len(acknowledged) >= 50

    await wait_until(some_acknowledged, what="the producer is running")
    await asyncio.to_thread(local_broker.restart_kafka)
    restarted.set()
    await producing

    received = await read_topics(settings, [topics.telemetry], len(acknowledged))
    assert set(acknowledged) <= {r.value for r in received}


async def test_the_log_reaches_consumers_whole_across_a_broker_restart(
    local_broker: Stack, settings: Settings, store: EventStore, topics: Topics
) -> None:
    await create_effects_table(settings)
    consumer = EventConsumer(
        settings,
        store.pool,
        name="steady",
        topics=[topics.jobs],
        handlers={"JobDeferred": count_effects},
    )
    appended = 0
    stop_appending = asyncio.Event()

    async def append() -> None:
        nonlocal appended
        while not stop_appending.is_set():
            await store.append(f"job-{appended % 5}", None, deferrals(str(appended % 5), 1))
            appended += 1
            await asyncio.sleep(0.005)

    async def applied() -> int:
        async with store.pool.acquire() as c:
            return int(await c.fetchval("SELECT count(*) FROM effects WHERE times = 1"))

    async with running(OutboxRelay(store, settings)), running(consumer):
        appending = asyncio.create_task(append())

        async def flowing() -> bool:
            return await applied() >= 50

        await wait_until(flowing, what="events flow from the log to the consumer")
        await asyncio.to_thread(local_broker.restart_kafka)

        appended_at_restart = appended

        async def appended_since() -> bool:
            return appended >= appended_at_restart + 100

        await wait_until(appended_since, what="more events appended after the restart")
        stop_appending.set()
        await appending

        async def all_applied() -> bool:
            return await applied() == await store.head()

        await wait_until(all_applied, what="every event in the log applied once")

    async with store.pool.acquire() as c:
        assert await c.fetchval("SELECT count(*) FROM effects WHERE times <> 1") == 0
