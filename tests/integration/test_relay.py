"""The outbox relay: the log reaches Kafka in order, at least once, across crashes."""

from __future__ import annotations

import asyncio
import signal
import sys
from collections import defaultdict
from pathlib import Path

import asyncpg
import pytest
from aiokafka.partitioner import DefaultPartitioner

from schemas import EventEnvelope
from schemas.jobs import JobDeferred
from services.runtime import (
    EventConsumer,
    EventStore,
    OutboxRelay,
    Outcome,
    Settings,
    StreamAppend,
    Topics,
)
from tests.integration.support import (
    appends_waiting,
    count_effects,
    create_effects_table,
    deferrals,
    header,
    read_topics,
    running,
    service_environment,
    wait_until,
)

pytestmark = pytest.mark.integration


async def _relay_position(store: EventStore, name: str = "outbox") -> int:
    async with store.pool.acquire() as c:
        position = await c.fetchval("SELECT position FROM relay_positions WHERE name = $1", name)
    return 0 if position is None else int(position)


async def test_the_relay_publishes_each_stream_in_order_to_its_category_keyed_by_stream(
    settings: Settings, store: EventStore, topics: Topics
) -> None:
    for i in range(30):
        await store.append(f"job-{i % 3}", None, deferrals(str(i % 3), 2, start=2 * i))

    async with running(OutboxRelay(store, settings)):
        records = await read_topics(settings, [topics.jobs], 60)

        async def position_stored() -> bool:
            return await _relay_position(store) == 60

        await wait_until(position_stored, what="the relay stored its position")

    by_key: dict[bytes, list[EventEnvelope]] = defaultdict(list)
    for record in records:
        envelope = EventEnvelope.from_json(record.value)
        assert record.key == envelope.stream.encode()
        assert header(record, "type") == "JobDeferred"
        by_key[record.key].append(envelope)
    assert sorted(by_key) == [b"job-0", b"job-1", b"job-2"]
    for envelopes in by_key.values():
        assert [e.version for e in envelopes] == list(range(1, 21))
    assert sorted(e.position or 0 for es in by_key.values() for e in es) == list(range(1, 61))


async def test_a_round_larger_than_a_record_batch_lands_in_send_s_partitions_in_log_order(
    settings: Settings, store: EventStore, topics: Topics
) -> None:
    """The relay writes a round's records into per-partition record batches itself: each must
    land where the producer's `send` would put it (aiokafka's default partitioner), and a
    partition's records, spread over several record batches (256 KiB each), in log order."""
    streams = [f"job-big{i}" for i in range(5)]
    per_stream = 80
    for _ in range(per_stream):
        await store.append_many(
            [
                StreamAppend(s, None, [JobDeferred(job_id=s[4:], code="t", message="x" * 2000)])
                for s in streams
            ]
        )
    total = per_stream * len(streams)
    async with running(OutboxRelay(store, settings)):
        records = await read_topics(settings, [topics.jobs], total)
    assert len(records) == total
    partitions = sorted({r.partition for r in records})
    default = DefaultPartitioner()
    by_partition: dict[int, list[int]] = defaultdict(list)
    for record in records:
        assert record.key is not None
        assert record.partition == default(record.key, partitions, partitions)
        by_partition[record.partition].append(int(header(record, "position") or 0))
    for positions in by_partition.values():
        assert positions == sorted(positions)
    assert sorted(p for ps in by_partition.values() for p in ps) == list(range(1, total + 1))
    # More than one record batch of a partition in one round: 400 records of ~2.6 KB.
    assert max(len(ps) for ps in by_partition.values()) * 2600 > 256 * 1024


async def test_the_relay_does_not_skip_an_event_whose_transaction_commits_late(
    settings: Settings, store: EventStore, topics: Topics
) -> None:
    async with running(OutboxRelay(store, settings)):
        late = await asyncpg.connect(settings.pg_dsn)
        try:
            transaction = late.transaction()
            await transaction.start()
            await store.append("job-late", 0, deferrals("late", 2), conn=late)
            early = asyncio.gather(
                *(store.append(f"job-e{i}", 0, deferrals(f"e{i}", 1)) for i in range(3))
            )

            async def early_ones_are_waiting() -> bool:
                return await appends_waiting(store) >= 1

            await wait_until(early_ones_are_waiting, what="the early appends wait for the late")
            await transaction.commit()
            await early
        finally:
            await late.close()
        records = await read_topics(settings, [topics.jobs], 5)

        async def position_stored() -> bool:
            return await _relay_position(store) == 5

        await wait_until(position_stored, what="the relay stored its position")

    positions = sorted(EventEnvelope.from_json(r.value).position or 0 for r in records)
    assert positions == [1, 2, 3, 4, 5]


async def _spawn_relay(settings: Settings, workdir: Path) -> asyncio.subprocess.Process:
    env = service_environment(
        settings,
        GANGWAY_SERVICE_NAME="relay-under-test",
        # Small batches: the relay stores its position many times while it catches up.
        GANGWAY_RELAY_BATCH_SIZE="50",
        GANGWAY_RELAY_POLL_INTERVAL_S="0.2",
    )
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "services.runtime.relay", cwd=workdir, env=env
    )


async def test_a_killed_relay_resumes_and_redelivered_events_change_nothing_downstream(
    settings: Settings,
    store: EventStore,
    topics: Topics,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A shell that sourced its own stack's settings: the relay started here must not take its
    # name, or it stores its position under another row than the one read here.
    monkeypatch.setenv("GANGWAY_RELAY_NAME", "the-callers-relay")
    monkeypatch.setenv("GANGWAY_RELAY_BATCH_SIZE", "100000")
    await create_effects_table(settings)
    consumer = EventConsumer(
        settings,
        store.pool,
        name="downstream",
        topics=list(topics.log_topics),
        handlers={"JobDeferred": count_effects},
    )

    async def append(batches: int) -> None:
        for i in range(batches):
            await store.append(f"job-{i % 7}", None, deferrals(str(i % 7), 10))

    async def effects() -> tuple[int, int]:
        async with store.pool.acquire() as c:
            row = await c.fetchrow("SELECT count(*), COALESCE(max(times), 0) FROM effects")
        return int(row[0]), int(row[1])

    async with running(consumer):
        await append(100)
        relay = await _spawn_relay(settings, tmp_path)
        appending = asyncio.create_task(append(100))

        async def relay_has_progressed() -> bool:
            return await _relay_position(store) >= 100

        await wait_until(relay_has_progressed, what="the relay published part of the log")
        relay.send_signal(signal.SIGKILL)
        await relay.wait()
        killed_at = await _relay_position(store)
        await appending
        await append(100)
        assert killed_at < await store.head()

        relay = await _spawn_relay(settings, tmp_path)
        try:

            async def all_applied() -> bool:
                return (await effects())[0] == await store.head()

            await wait_until(all_applied, what="every event applied downstream")
            assert await effects() == (3000, 1)

            # Forget the relay's position, as if it had crashed before storing any of it:
            # the whole log is published again, and the inbox absorbs every copy.
            relay.send_signal(signal.SIGKILL)
            await relay.wait()
            async with store.pool.acquire() as c:
                await c.execute("UPDATE relay_positions SET position = 0")
            relay = await _spawn_relay(settings, tmp_path)

            async def all_seen_again() -> bool:
                return consumer.counts[Outcome.DUPLICATE] >= 3000

            await wait_until(all_seen_again, what="the republished log reached the consumer")
        finally:
            relay.send_signal(signal.SIGTERM)
            assert await relay.wait() == 0

    assert await effects() == (3000, 1)
    assert consumer.counts[Outcome.APPLIED] == 3000


async def _relay_lock_holders(store: EventStore) -> list[int]:
    async with store.pool.acquire() as c:
        rows = await c.fetch(
            """SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted
               AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"""
        )
    return [int(r["pid"]) for r in rows]


async def test_a_relay_whose_session_is_terminated_takes_its_lock_again_and_goes_on(
    settings: Settings, store: EventStore, topics: Topics
) -> None:
    fast = settings.model_copy(update={"relay_poll_interval_s": 0.2})
    async with running(OutboxRelay(store, fast)):
        await store.append("job-a", None, deferrals("a", 1))
        await read_topics(settings, [topics.jobs], 1)
        [holder] = await _relay_lock_holders(store)
        async with store.pool.acquire() as c:
            # What a database restart does to the session that holds the relay's lock.
            assert await c.fetchval("SELECT pg_terminate_backend($1)", holder)

        async def locked_again() -> bool:
            holders = await _relay_lock_holders(store)
            return len(holders) == 1 and holders != [holder]

        await wait_until(locked_again, what="the relay holds its lock on a new session")
        await store.append("job-a", None, deferrals("a", 1, start=1))
        records = await read_topics(settings, [topics.jobs], 2)
        assert [EventEnvelope.from_json(r.value).position for r in records] == [1, 2]
