"""The admission service against the real log (and, once, through the relay and Kafka)."""

from __future__ import annotations

import asyncio

import pytest

from core.policy import SchedulingPolicy
from core.topology import parse_cluster_spec
from schemas import EventEnvelope
from schemas.jobs import (
    JobAdmitted,
    JobCancelled,
    JobCancelRequested,
    JobRejected,
    JobSpec,
    JobSubmitted,
)
from schemas.teams import TeamCreated
from services.admission.service import Admission
from services.runtime import EventConsumer, EventStore, OutboxRelay, Settings, StreamAppend, Topics
from tests.integration.support import running, started, wait_until

pytestmark = pytest.mark.integration

CLASSES = [pc.name for pc in SchedulingPolicy().priority_classes]


def admission(store: EventStore) -> Admission:
    return Admission(store, CLASSES)


async def create_team(store: EventStore, name: str = "vision") -> None:
    team = TeamCreated(name=name, guaranteed_gpus=8, max_gpus=64, token_sha256="0" * 64)
    await store.append(team.stream, 0, [team])


async def register_nodes(store: EventStore) -> None:
    await store.append_many([StreamAppend(e.stream, 0, [e]) for e in parse_cluster_spec("4x8")])


async def submit(store: EventStore, job_id: str, team: str = "vision") -> EventEnvelope:
    spec = JobSpec(name=job_id, team=team, tasks=2, gpus_per_task=4)
    [envelope] = await store.append(
        f"job-{job_id}", 0, [JobSubmitted(job_id=job_id, spec=spec, submitted_by="tests")]
    )
    return envelope


async def handle(admission: Admission, envelope: EventEnvelope) -> None:
    async with admission.store.pool.acquire() as conn, conn.transaction():
        await admission.on_submitted(envelope, conn)


async def decisions(store: EventStore, job_id: str) -> list[EventEnvelope]:
    return [
        e
        for e in await store.read_stream(f"job-{job_id}")
        if isinstance(e.payload, JobAdmitted | JobRejected)
    ]


async def test_a_team_created_just_before_the_submission_is_known_to_the_decision(
    store: EventStore,
) -> None:
    deciding = admission(store)
    await deciding.catch_up()
    await register_nodes(store)
    await create_team(store)
    envelope = await submit(store, "j1")
    await handle(deciding, envelope)
    [decision] = await decisions(store, "j1")
    assert decision.payload == JobAdmitted(job_id="j1", queue="vision", priority="research")
    assert decision.causation_id == envelope.event_id


async def test_a_team_created_after_the_submission_does_not_count_for_it(
    store: EventStore,
) -> None:
    await register_nodes(store)
    envelope = await submit(store, "early")
    await create_team(store)
    await handle(admission(store), envelope)
    [decision] = await decisions(store, "early")
    assert isinstance(decision.payload, JobRejected)
    assert decision.payload.code == "unknown_team"


async def test_a_redelivered_submission_of_a_decided_job_changes_nothing(
    store: EventStore,
) -> None:
    await register_nodes(store)
    await create_team(store)
    envelope = await submit(store, "twice")
    await handle(admission(store), envelope)
    # A second replica (its own inbox) receives the same message.
    await handle(admission(store), envelope)
    assert len(await decisions(store, "twice")) == 1


async def test_submissions_on_the_bus_are_each_decided_once_in_their_job_stream(
    settings: Settings, store: EventStore
) -> None:
    await register_nodes(store)
    await create_team(store)
    deciding = admission(store)
    consumer = EventConsumer(
        settings,
        store.pool,
        name="admission",
        topics=[Topics.from_settings(settings).jobs],
        handlers={"JobSubmitted": deciding.on_submitted},
        batch_scope=deciding.batch,  # as the service wires it: a batch's decisions at once
    )
    async with running(OutboxRelay(store, settings)), running(consumer) as task:
        await started(consumer, task)
        for i in range(20):
            await submit(store, f"bus{i}", team="vision" if i % 2 == 0 else "nobody")

        async def all_decided() -> bool:
            counts = await asyncio.gather(*(decisions(store, f"bus{i}") for i in range(20)))
            return all(len(found) == 1 for found in counts)

        await wait_until(all_decided, what="every job decided once")
    for i in range(20):
        [decision] = await decisions(store, f"bus{i}")
        expected = JobAdmitted if i % 2 == 0 else JobRejected
        assert isinstance(decision.payload, expected)


async def test_a_submission_already_followed_by_a_cancel_request_is_decided_after_it(
    store: EventStore,
) -> None:
    await register_nodes(store)
    await create_team(store)
    envelope = await submit(store, "quick")
    await store.append("job-quick", 1, [JobCancelRequested(job_id="quick", by="vision")])
    await handle(admission(store), envelope)
    history = await store.read_stream("job-quick")
    assert [e.type for e in history] == ["JobSubmitted", "JobCancelRequested", "JobAdmitted"]


async def test_a_submission_cancelled_before_its_decision_is_not_admitted_after(
    store: EventStore,
) -> None:
    # attack4's storm: Kafka restarted, admission caught up 13 s late, and the scheduler had
    # cancelled the waiting job meanwhile; admission, finding the stream moved on, wrote
    # JobAdmitted after JobCancelled (the auditor: "JobAdmitted for job ... after it finished").
    await register_nodes(store)
    await create_team(store)
    envelope = await submit(store, "gone")
    await store.append("job-gone", 1, [JobCancelRequested(job_id="gone", by="vision")])
    cancelled = JobCancelled(job_id="gone", attempt=None, reason="cancelled by request")
    await store.append("job-gone", 2, [cancelled])
    await handle(admission(store), envelope)
    history = await store.read_stream("job-gone")
    assert [e.type for e in history] == ["JobSubmitted", "JobCancelRequested", "JobCancelled"]


async def handle_batch(admission: Admission, envelopes: list[EventEnvelope]) -> None:
    async with (
        admission.store.pool.acquire() as conn,
        conn.transaction(),
        admission.batch(conn),
    ):
        for envelope in envelopes:
            await admission.on_submitted(envelope, conn)


async def test_a_batch_of_submissions_is_decided_in_one_append_in_log_order(
    store: EventStore,
) -> None:
    await register_nodes(store)
    await create_team(store)
    envelopes = [
        await submit(store, f"b{i}", team="vision" if i != 2 else "nobody") for i in range(5)
    ]
    head = await store.head()
    await handle_batch(admission(store), envelopes)
    written = await store.read_all(head)
    # One decision per job, each in its own stream, caused by its own submission; the
    # decisions are consecutive in the log (one write) and in the batch's order.
    assert [e.stream for e in written] == [f"job-b{i}" for i in range(5)]
    assert [e.position for e in written] == list(range(head + 1, head + 6))
    assert [e.causation_id for e in written] == [e.event_id for e in envelopes]
    assert [e.type for e in written] == [
        "JobAdmitted",
        "JobAdmitted",
        "JobRejected",
        "JobAdmitted",
        "JobAdmitted",
    ]


async def test_a_batch_that_fails_appends_none_of_its_decisions(store: EventStore) -> None:
    await register_nodes(store)
    await create_team(store)
    envelopes = [await submit(store, f"f{i}") for i in range(3)]
    head = await store.head()
    deciding = admission(store)
    with pytest.raises(RuntimeError, match="the batch's last handler failed"):
        async with (
            store.pool.acquire() as conn,
            conn.transaction(),
            deciding.batch(conn),
        ):
            for envelope in envelopes:
                await deciding.on_submitted(envelope, conn)
            raise RuntimeError("the batch's last handler failed")
    assert await store.head() == head
    # Applied again (as the consumer retries a batch), each job is decided once.
    await handle_batch(deciding, envelopes)
    for i in range(3):
        assert len(await decisions(store, f"f{i}")) == 1


async def test_in_a_batch_a_job_whose_stream_moved_on_is_decided_after_it_and_a_decided_one_is_left(
    store: EventStore,
) -> None:
    await register_nodes(store)
    await create_team(store)
    quick, decided, plain = [await submit(store, name) for name in ("quick", "done", "plain")]
    await store.append("job-quick", 1, [JobCancelRequested(job_id="quick", by="vision")])
    await handle(admission(store), decided)  # another replica decided it already
    await handle_batch(admission(store), [quick, decided, plain])
    assert [e.type for e in await store.read_stream("job-quick")] == [
        "JobSubmitted",
        "JobCancelRequested",
        "JobAdmitted",
    ]
    assert len(await decisions(store, "done")) == 1
    assert len(await decisions(store, "plain")) == 1


async def handle_tracked(admission: Admission, envelopes: list[EventEnvelope]) -> None:
    """As the consumer applies a batch: outside a transaction, the scope writing the inbox."""
    async with admission.store.pool.acquire() as conn, admission.batch(conn, "admission"):
        for envelope in envelopes:
            await admission.on_submitted(envelope, conn)


async def inbox_of(store: EventStore, consumer: str = "admission") -> set[object]:
    async with store.pool.acquire() as conn:
        rows = await conn.fetch("SELECT event_id FROM inbox WHERE consumer = $1", consumer)
    return {r["event_id"] for r in rows}


async def test_a_batch_outside_a_transaction_records_its_decisions_and_inbox_rows_at_once(
    store: EventStore,
) -> None:
    await register_nodes(store)
    await create_team(store)
    envelopes = [await submit(store, f"t{i}") for i in range(4)]
    head = await store.head()
    await handle_tracked(admission(store), envelopes)
    written = await store.read_all(head)
    assert [e.stream for e in written] == [f"job-t{i}" for i in range(4)]
    assert [e.position for e in written] == list(range(head + 1, head + 5))
    assert await inbox_of(store) == {e.event_id for e in envelopes}


async def test_a_batch_outside_a_transaction_decides_a_moved_stream_after_it_with_its_inbox_row(
    store: EventStore,
) -> None:
    await register_nodes(store)
    await create_team(store)
    quick, decided, plain = [await submit(store, name) for name in ("quick", "done", "plain")]
    await store.append("job-quick", 1, [JobCancelRequested(job_id="quick", by="vision")])
    await handle(admission(store), decided)  # another replica decided it already
    await handle_tracked(admission(store), [quick, decided, plain])
    assert [e.type for e in await store.read_stream("job-quick")] == [
        "JobSubmitted",
        "JobCancelRequested",
        "JobAdmitted",
    ]
    assert len(await decisions(store, "done")) == 1
    assert len(await decisions(store, "plain")) == 1
    # Every submission of the batch is recorded, the two written after a conflict included.
    assert await inbox_of(store) == {quick.event_id, decided.event_id, plain.event_id}


async def test_a_batch_outside_a_transaction_that_fails_writes_no_decision_and_no_inbox_row(
    store: EventStore,
) -> None:
    await register_nodes(store)
    await create_team(store)
    envelopes = [await submit(store, f"g{i}") for i in range(3)]
    head = await store.head()
    deciding = admission(store)
    with pytest.raises(RuntimeError, match="the batch's last handler failed"):
        async with store.pool.acquire() as conn, deciding.batch(conn, "admission"):
            for envelope in envelopes:
                await deciding.on_submitted(envelope, conn)
            raise RuntimeError("the batch's last handler failed")
    assert await store.head() == head
    assert await inbox_of(store) == set()
    # Applied again (as the consumer retries a batch), each job is decided once.
    await handle_tracked(deciding, envelopes)
    for i in range(3):
        assert len(await decisions(store, f"g{i}")) == 1
