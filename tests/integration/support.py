"""Small helpers for the integration tests: events to append, waiting, reading topics, effects."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import asyncpg
from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition

from schemas import EventEnvelope
from schemas.jobs import JobDeferred
from services.runtime import ConsumerLoop, EventStore, Settings
from services.runtime.kafka import client_environment, connection_options
from services.runtime.migrate import dsn_user
from tests.integration.conftest import ROOT

# A generous bound for things that take milliseconds; reaching it means the behaviour is broken.
PATIENCE_S = 90.0


def deferrals(job_id: str, count: int, *, tag: str = "t", start: int = 0) -> list[JobDeferred]:
    """Distinct events for stream job-<job_id>; `message` says who wrote it and in what order."""
    return [
        JobDeferred(job_id=job_id, code=tag, message=str(i)) for i in range(start, start + count)
    ]


async def wait_until(
    condition: Callable[[], Awaitable[bool]], *, what: str, patience_s: float = PATIENCE_S
) -> None:
    try:
        async with asyncio.timeout(patience_s):
            while True:
                if await condition():
                    return
                await asyncio.sleep(0.05)
    except TimeoutError:
        raise AssertionError(f"never happened: {what}") from None


async def read_topics(
    settings: Settings, topics: Sequence[str], count: int, *, patience_s: float = PATIENCE_S
) -> list[ConsumerRecord[bytes, bytes]]:
    """The first `count` messages on `topics`, from the beginning, without a consumer group."""
    consumer = AIOKafkaConsumer(
        **connection_options(settings),
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    await consumer.start()
    try:
        partitions = [
            TopicPartition(topic, p)
            for topic in topics
            for p in (await _partitions(consumer, topic))
        ]
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        records: list[ConsumerRecord[bytes, bytes]] = []
        async with asyncio.timeout(patience_s):
            while len(records) < count:
                batch = await consumer.getmany(timeout_ms=200)
                for part in batch.values():
                    records.extend(part)
        return records
    finally:
        await consumer.stop()


async def _partitions(consumer: AIOKafkaConsumer, topic: str) -> set[int]:
    async with asyncio.timeout(PATIENCE_S):
        while True:
            found = consumer.partitions_for_topic(topic)
            if found:
                return set(found)
            await consumer._client.force_metadata_update()  # topic created a moment ago
            await asyncio.sleep(0.05)


def header(record: ConsumerRecord[Any, Any], name: str) -> str | None:
    for key, value in record.headers or ():
        if key == name:
            return bytes(value).decode()
    return None


async def create_effects_table(settings: Settings) -> None:
    """A table a test handler writes its effects to: how many times each event was applied."""
    conn = await asyncpg.connect(settings.migration_dsn)
    try:
        await conn.execute(
            "CREATE TABLE effects (event_id uuid PRIMARY KEY, stream text NOT NULL,"
            " version integer NOT NULL, times integer NOT NULL)"
        )
        app = dsn_user(settings.pg_dsn)
        if app and app != dsn_user(settings.migration_dsn):
            await conn.execute(f'GRANT SELECT, INSERT, UPDATE ON effects TO "{app}"')
    finally:
        await conn.close()


async def count_effects(envelope: EventEnvelope, conn: asyncpg.Connection) -> None:
    """The handler under test: without an inbox, a redelivery would raise `times` above 1."""
    await conn.execute(
        "INSERT INTO effects (event_id, stream, version, times) VALUES ($1, $2, $3, 1)"
        " ON CONFLICT (event_id) DO UPDATE SET times = effects.times + 1",
        envelope.event_id,
        envelope.stream,
        envelope.version,
    )


@contextlib.asynccontextmanager
async def running(loop: ConsumerLoop | Any) -> AsyncIterator[asyncio.Task[None]]:
    """Run a consumer or relay (anything with `run(stop)`) for the body of the block."""
    stop = asyncio.Event()
    task = asyncio.create_task(loop.run(stop))
    try:
        yield task
    finally:
        stop.set()
        await asyncio.wait_for(task, PATIENCE_S)


async def started(loop: ConsumerLoop, task: asyncio.Task[None]) -> None:
    """Wait until the consumer owns its partitions (or has died trying)."""
    waiter = asyncio.create_task(loop.started.wait())
    async with asyncio.timeout(PATIENCE_S):
        done, _ = await asyncio.wait({waiter, task}, return_when=asyncio.FIRST_COMPLETED)
    if task in done:
        waiter.cancel()
        task.result()
        raise AssertionError("the consumer stopped before it started")


async def appends_waiting(store: EventStore) -> int:
    """How many appends are blocked behind another append's transaction (on the head row's
    lock, which the store's one append statement takes: services/runtime/store.py)."""
    async with store.pool.acquire() as c:
        return int(
            await c.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND wait_event_type = 'Lock' AND query LIKE '%event_log_append_checked%'"
            )
        )


def service_environment(settings: Settings, **variables: str) -> dict[str, str]:
    """The environment of a service process a test starts: the connections of `settings` and
    `variables`, and none of the caller's GANGWAY_* variables (a shell that sourced its own
    stack's settings must not configure the service under test). Start it in a directory
    without a `.gangway/env`, which it would read for what is missing here."""
    return {
        **{key: value for key, value in os.environ.items() if not key.startswith("GANGWAY_")},
        "PYTHONPATH": str(ROOT),
        "GANGWAY_PG_DSN": settings.pg_dsn,
        "GANGWAY_PG_OWNER_DSN": settings.migration_dsn,
        **client_environment(settings),
        "GANGWAY_TOPIC_PREFIX": settings.topic_prefix,
        **variables,
    }
