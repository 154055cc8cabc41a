"""The event store against the real PostgreSQL: concurrency, atomicity, order, fencing."""

from __future__ import annotations

import asyncio
import json
from uuid import uuid4

import asyncpg
import pytest

from schemas.jobs import JobDeferred
from services.runtime import (
    ConcurrencyConflict,
    EventStore,
    Metadata,
    Settings,
    StaleLeader,
    StreamAppend,
    acquire_leadership,
)
from services.runtime.errors import EventTooLarge
from services.runtime.limits import MAX_EVENT_BYTES
from services.runtime.store import Inbox
from tests.integration.support import appends_waiting, deferrals, wait_until

pytestmark = pytest.mark.integration


async def test_ten_concurrent_writers_record_every_version_of_a_stream_exactly_once(
    store: EventStore,
) -> None:
    writers, appends_each = 10, 100
    conflicts = [0] * writers

    async def writer(w: int) -> None:
        done = 0
        while done < appends_each:
            version = await store.stream_version("job-shared")
            event = JobDeferred(job_id="shared", code=f"w{w}", message=str(done))
            try:
                await store.append("job-shared", version, [event])
                done += 1
            except ConcurrencyConflict as conflict:
                assert conflict.stream == "job-shared" and conflict.actual > version
                conflicts[w] += 1

    await asyncio.gather(*(writer(w) for w in range(writers)))

    recorded = await store.read_stream("job-shared")
    assert [e.version for e in recorded] == list(range(1, writers * appends_each + 1))
    assert [e.position for e in recorded] == list(range(1, writers * appends_each + 1))
    for w in range(writers):
        mine = [e.payload for e in recorded if isinstance(e.payload, JobDeferred)]
        assert [p.message for p in mine if p.code == f"w{w}"] == [
            str(i) for i in range(appends_each)
        ]
    assert await store.head() == writers * appends_each


async def test_writers_holding_the_same_expected_version_all_but_one_conflict(
    store: EventStore,
) -> None:
    results = await asyncio.gather(
        *(store.append("job-race", 0, deferrals("race", 1, tag=f"w{w}")) for w in range(10)),
        return_exceptions=True,
    )

    conflicts = [r for r in results if isinstance(r, ConcurrencyConflict)]
    assert len(conflicts) == 9
    assert all((c.expected, c.actual) == (0, 1) for c in conflicts)
    assert [e.version for e in await store.read_stream("job-race")] == [1]


async def test_appends_committed_together_keep_their_own_outcomes(store: EventStore) -> None:
    await store.append("job-taken", 0, deferrals("taken", 1))

    results = await asyncio.gather(
        *(store.append(f"job-free{i}", 0, deferrals(f"free{i}", 2)) for i in range(5)),
        *(store.append("job-taken", 0, deferrals("taken", 1)) for _ in range(5)),
        return_exceptions=True,
    )

    assert all(isinstance(r, list) and len(r) == 2 for r in results[:5])
    assert all(isinstance(r, ConcurrencyConflict) for r in results[5:])
    assert [e.position for e in await store.read_all()] == list(range(1, 12))
    assert [e.version for e in await store.read_stream("job-taken")] == [1]


async def test_appends_written_together_in_a_transaction_keep_their_own_outcomes_and_metadata(
    store: EventStore,
) -> None:
    await store.append("job-moved", 0, deferrals("moved", 1))
    causes = [Metadata(correlation_id=uuid4(), causation_id=uuid4()) for _ in range(3)]
    async with store.pool.acquire() as conn, conn.transaction():
        results = await store.append_each(
            [
                (StreamAppend("job-x", 0, deferrals("x", 1)), causes[0]),
                (StreamAppend("job-moved", 0, deferrals("moved", 1, tag="late")), causes[1]),
                (StreamAppend("job-y", 0, deferrals("y", 2)), causes[2]),
            ],
            conn=conn,
        )
    first, refused, last = results
    assert isinstance(refused, ConcurrencyConflict)
    assert (refused.stream, refused.expected, refused.actual) == ("job-moved", 0, 1)
    assert isinstance(first, list) and isinstance(last, list)
    assert [(e.stream, e.position, e.causation_id) for e in first + last] == [
        ("job-x", 2, causes[0].causation_id),
        ("job-y", 3, causes[2].causation_id),
        ("job-y", 4, causes[2].causation_id),
    ]
    assert [e.version for e in await store.read_stream("job-moved")] == [1]
    assert await store.head() == 4


async def test_appends_with_an_inbox_record_in_one_statement_each_written_appends_event_only(
    store: EventStore,
) -> None:
    # A consumer's batch as one statement of its own: the inbox rows of the events whose
    # reactions were written, and none for the one whose stream moved on (it is handled again).
    await store.append("job-moved", 0, deferrals("moved", 1))
    answered = [uuid4() for _ in range(3)]
    async with store.pool.acquire() as conn:
        results = await store.append_each(
            [
                (StreamAppend("job-x", 0, deferrals("x", 2)), Metadata()),
                (StreamAppend("job-moved", 0, deferrals("moved", 1, tag="late")), Metadata()),
                (StreamAppend("job-y", 0, deferrals("y", 1)), Metadata()),
            ],
            conn=conn,
            inbox=Inbox("deciding", answered),
        )
        recorded = await conn.fetch(
            "SELECT consumer, event_id FROM inbox WHERE consumer = 'deciding'"
        )
    assert [type(r) for r in results] == [list, ConcurrencyConflict, list]
    assert {(r["consumer"], r["event_id"]) for r in recorded} == {
        ("deciding", answered[0]),
        ("deciding", answered[2]),
    }
    assert await store.head() == 4


async def test_appends_with_an_inbox_need_one_answered_event_each(store: EventStore) -> None:
    async with store.pool.acquire() as conn:
        with pytest.raises(ValueError, match="2 appends answer 1 events"):
            await store.append_each(
                [
                    (StreamAppend(f"job-v{i}", 0, deferrals(f"v{i}", 1)), Metadata())
                    for i in range(2)
                ],
                conn=conn,
                inbox=Inbox("deciding", [uuid4()]),
            )
    assert await store.head() == 0


async def test_appends_written_together_see_the_versions_the_earlier_ones_wrote(
    store: EventStore,
) -> None:
    async with store.pool.acquire() as conn, conn.transaction():
        results = await store.append_each(
            [
                (StreamAppend("job-z", 0, deferrals("z", 2)), Metadata()),
                (StreamAppend("job-z", 2, deferrals("z", 1, tag="second")), Metadata()),
                (StreamAppend("job-z", 2, deferrals("z", 1, tag="stale")), Metadata()),
                (StreamAppend("job-w", None, deferrals("w", 1)), Metadata()),
            ],
            conn=conn,
        )
    first, second, stale, any_version = results
    assert isinstance(stale, ConcurrencyConflict)
    assert (stale.stream, stale.expected, stale.actual) == ("job-z", 2, 3)
    assert isinstance(first, list) and isinstance(second, list)
    assert isinstance(any_version, list)
    assert [(e.stream, e.version, e.position) for e in first + second + any_version] == [
        ("job-z", 1, 1),
        ("job-z", 2, 2),
        ("job-z", 3, 3),
        ("job-w", 1, 4),
    ]
    assert [(e.version, e.position) for e in await store.read_stream("job-z")] == [
        (1, 1),
        (2, 2),
        (3, 3),
    ]


async def test_a_group_skips_a_request_to_several_streams_whole_when_one_stream_moved(
    store: EventStore,
) -> None:
    await store.append("job-moved", 0, deferrals("moved", 1))

    results = await asyncio.gather(
        store.append("job-before", 0, deferrals("before", 1)),
        store.append_many(
            [
                StreamAppend("job-fresh", 0, deferrals("fresh", 2)),
                StreamAppend("job-moved", 0, deferrals("moved", 1, tag="late")),
            ]
        ),
        store.append("job-after", 0, deferrals("after", 1)),
        return_exceptions=True,
    )

    before, refused, after = results
    assert isinstance(refused, ConcurrencyConflict)
    assert (refused.stream, refused.expected, refused.actual) == ("job-moved", 0, 1)
    assert isinstance(before, list) and isinstance(after, list)
    assert [(e.stream, e.position) for e in await store.read_all(1)] == [
        ("job-before", 2),
        ("job-after", 3),
    ]
    assert await store.read_stream("job-fresh") == []


async def test_appends_written_together_are_undone_with_their_transaction(
    store: EventStore,
) -> None:
    with pytest.raises(RuntimeError, match="after the appends"):
        async with store.pool.acquire() as conn, conn.transaction():
            await store.append_each(
                [
                    (StreamAppend(f"job-u{i}", 0, deferrals(f"u{i}", 1)), Metadata())
                    for i in range(3)
                ],
                conn=conn,
            )
            raise RuntimeError("after the appends")
    assert await store.head() == 0


async def test_an_append_to_several_streams_is_all_or_nothing(store: EventStore) -> None:
    await store.append("job-b", 0, deferrals("b", 2))

    with pytest.raises(ConcurrencyConflict) as refused:
        await store.append_many(
            [
                StreamAppend("job-a", 0, deferrals("a", 3)),
                StreamAppend("job-b", 1, deferrals("b", 1)),
            ]
        )

    assert (refused.value.stream, refused.value.expected, refused.value.actual) == ("job-b", 1, 2)
    assert await store.read_stream("job-a") == []
    assert await store.head() == 2


async def test_an_append_to_several_streams_records_each_at_its_next_versions(
    store: EventStore,
) -> None:
    await store.append("job-b", 0, deferrals("b", 2))

    recorded = await store.append_many(
        [StreamAppend("job-a", 0, deferrals("a", 2)), StreamAppend("job-b", 2, deferrals("b", 1))],
        Metadata(correlation_id=None, producer="scheduler"),
    )

    assert [(e.stream, e.version, e.position) for e in recorded] == [
        ("job-a", 1, 3),
        ("job-a", 2, 4),
        ("job-b", 3, 5),
    ]
    assert [e.producer for e in await store.read_all(2)] == ["scheduler"] * 3


async def test_a_refused_append_leaves_no_gap_in_positions(store: EventStore) -> None:
    await store.append("job-x", 0, deferrals("x", 1))
    with pytest.raises(ConcurrencyConflict):
        await store.append("job-x", 0, deferrals("x", 1))
    await store.append("job-y", 0, deferrals("y", 1))

    assert [e.position for e in await store.read_all()] == [1, 2]


async def test_read_stream_returns_the_events_after_a_version_typed_and_in_order(
    store: EventStore,
) -> None:
    await store.append("job-r", 0, deferrals("r", 5))

    later = await store.read_stream("job-r", after_version=3)

    assert [(e.version, e.payload) for e in later] == [
        (4, JobDeferred(job_id="r", code="t", message="3")),
        (5, JobDeferred(job_id="r", code="t", message="4")),
    ]


async def test_an_event_for_another_stream_is_refused(store: EventStore) -> None:
    with pytest.raises(ValueError, match="belongs to stream"):
        await store.append("job-one", 0, deferrals("two", 1))


async def test_a_tailing_reader_never_skips_an_event_whose_transaction_commits_late(
    store: EventStore, settings: Settings
) -> None:
    seen: list[int] = []
    stop_tailing = asyncio.Event()

    async def tail() -> None:
        position = 0
        while not stop_tailing.is_set() or position < await store.head():
            for event in await store.read_all(position, 100):
                assert event.position is not None
                seen.append(event.position)
                position = event.position
            await asyncio.sleep(0.005)

    tailer = asyncio.create_task(tail())
    late = await asyncpg.connect(settings.pg_dsn)
    try:
        transaction = late.transaction()
        await transaction.start()
        await store.append("job-late", 0, deferrals("late", 3), conn=late)
        # Appends that begin while the late one is open, and would commit first if they could.
        early = asyncio.gather(
            *(store.append(f"job-early{i}", 0, deferrals(f"early{i}", 2)) for i in range(5))
        )

        async def early_ones_are_waiting() -> bool:
            return await appends_waiting(store) >= 1

        await wait_until(early_ones_are_waiting, what="the early appends wait for the late one")
        await transaction.commit()
        await early
    finally:
        await late.close()
    stop_tailing.set()
    await tailer

    assert seen == list(range(1, 14))
    assert [e.stream for e in await store.read_all(0, 3)] == ["job-late"] * 3


async def test_only_one_process_leads_at_a_time(store: EventStore, settings: Settings) -> None:
    first = await acquire_leadership(store, settings.pg_dsn, "first")
    assert first is not None
    stop = asyncio.Event()
    second = asyncio.create_task(
        acquire_leadership(store, settings.pg_dsn, "second", poll_interval_s=0.05, stop=stop)
    )
    await asyncio.sleep(0.3)  # gives the second candidate several tries at the lock
    assert not second.done()

    await first.release()
    successor = await asyncio.wait_for(second, 30)

    assert successor is not None
    assert (first.epoch, successor.epoch) == (1, 2)
    elected = await store.read_stream("scheduler")
    assert [(e.payload.model_dump()["leader_id"], e.epoch) for e in elected] == [
        ("first", 1),
        ("second", 2),
    ]
    await successor.release()


async def test_a_deposed_leader_cannot_append(store: EventStore, settings: Settings) -> None:
    old = await acquire_leadership(store, settings.pg_dsn, "old")
    assert old is not None
    await store.append("job-f", 0, deferrals("f", 1), epoch=old.epoch)
    await old.release()
    new = await acquire_leadership(store, settings.pg_dsn, "new")
    assert new is not None

    with pytest.raises(StaleLeader) as fenced:
        await store.append("job-f", 1, deferrals("f", 1, start=1), epoch=old.epoch)

    assert (fenced.value.epoch, fenced.value.current) == (1, 2)
    assert [e.version for e in await store.read_stream("job-f")] == [1]
    await store.append("job-f", 1, deferrals("f", 1, start=1), epoch=new.epoch)
    assert [e.epoch for e in await store.read_stream("job-f")] == [1, 2]
    await new.release()


async def test_a_deposed_leader_is_told_so_even_when_its_append_would_conflict(
    store: EventStore, settings: Settings
) -> None:
    old = await acquire_leadership(store, settings.pg_dsn, "old")
    assert old is not None
    await old.release()
    new = await acquire_leadership(store, settings.pg_dsn, "new")
    assert new is not None
    await store.append("job-g", 0, deferrals("g", 1), epoch=new.epoch)

    with pytest.raises(StaleLeader) as fenced:
        await store.append("job-g", 0, deferrals("g", 1, tag="late"), epoch=old.epoch)

    assert (fenced.value.epoch, fenced.value.current) == (1, 2)
    assert [e.epoch for e in await store.read_stream("job-g")] == [2]
    await new.release()


async def test_a_leader_learns_it_lost_its_session(store: EventStore, settings: Settings) -> None:
    leader = await acquire_leadership(store, settings.pg_dsn, "doomed")
    assert leader is not None
    assert await leader.still_held()

    async with store.pool.acquire() as c:
        await c.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_locks"
            " WHERE locktype = 'advisory' AND granted AND pid <> pg_backend_pid()"
        )

    assert not await leader.still_held()
    await leader.release()


async def test_replay_reads_the_whole_log_in_commit_order(store: EventStore) -> None:
    for i in range(7):
        await store.append(f"job-{i % 3}", None, deferrals(str(i % 3), 10, start=i * 10))

    batches = [batch async for batch in store.iter_raw(batch_size=16)]
    replayed = [envelope async for envelope in store.replay(batch_size=16)]

    assert [len(b) for b in batches] == [16, 16, 16, 16, 6]
    assert [r.position for b in batches for r in b] == list(range(1, 71))
    assert [e.position for e in replayed] == list(range(1, 71))


async def test_payloads_given_with_an_append_are_what_the_log_stores(store: EventStore) -> None:
    event = JobDeferred(job_id="dumped", code="c", message="m")
    payload = event.model_dump_json()
    [written] = await store.append_many([StreamAppend(event.stream, 0, [event], (payload,))])
    [recorded] = await store.read_all_raw(0, 1)
    assert json.loads(recorded.payload) == json.loads(payload)
    assert written.payload == event


async def test_payloads_given_are_held_to_the_event_bound_and_must_match_the_events(
    store: EventStore,
) -> None:
    event = JobDeferred(job_id="dumped", code="c", message="m")
    big = '{"message": "' + "x" * MAX_EVENT_BYTES + '"}'
    with pytest.raises(EventTooLarge):
        await store.append_many([StreamAppend(event.stream, 0, [event], (big,))])
    with pytest.raises(ValueError, match="2 payloads"):
        await store.append_many([StreamAppend(event.stream, 0, [event], ("{}", "{}"))])
    assert await store.head() == 0
