"""The scheduler service in-process against the real PostgreSQL: leading, fencing, replay."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
from prometheus_client import Counter

from core.policy import SchedulingPolicy
from core.topology import parse_cluster_spec
from schemas.base import Event
from schemas.jobs import (
    GangReserved,
    JobAdmitted,
    JobCancelled,
    JobCancelRequested,
    JobFailed,
    JobSpec,
    JobSubmitted,
    PreemptionRequested,
    TaskExited,
    TaskStarted,
    TopologySpec,
)
from schemas.teams import TeamCreated
from services.runtime import (
    NOTIFY_CHANNEL,
    EventStore,
    Leadership,
    Settings,
    StreamAppend,
    acquire_leadership,
)
from services.runtime.metrics import new_registry
from services.scheduler.bootstrap import wired
from services.scheduler.folding import Folded
from services.scheduler.metrics import SchedulerMetrics
from services.scheduler.replay import differences, rebuild, verify_replay
from services.scheduler.service import SchedulerService
from services.scheduler.settings import SchedulerSettings
from services.scheduler.snapshots import SnapshotStore, code_version
from tests.integration.support import wait_until

pytestmark = pytest.mark.integration


def scheduler_settings(settings: Settings, name: str, **overrides: object) -> SchedulerSettings:
    values = {
        **settings.model_dump(),
        "service_name": "scheduler",
        "instance_id": name,
        "metrics_port": 0,
        "scheduler_cycle_interval_s": 0.2,
        "scheduler_standby_poll_s": 0.1,
        **overrides,
    }
    return SchedulerSettings.model_validate(values)


@dataclass
class Replica:
    service: SchedulerService
    stop: asyncio.Event
    task: asyncio.Task[int]


@contextlib.asynccontextmanager
async def replica(settings: Settings, name: str, **overrides: object) -> AsyncIterator[Replica]:
    config = scheduler_settings(settings, name, **overrides)
    async with wired(config) as wiring:
        service = SchedulerService(
            config,
            wiring.store,
            wiring.policy,
            wiring.snapshots,
            SchedulerMetrics.create(new_registry()),
        )
        stop = asyncio.Event()
        task = asyncio.create_task(service.run(stop))
        try:
            yield Replica(service, stop, task)
        finally:
            stop.set()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(task, 30)


async def seed_cluster(store: EventStore, cluster: str = "16x8:4:2") -> None:
    nodes = parse_cluster_spec(cluster)
    team = TeamCreated(name="team-a", guaranteed_gpus=64, max_gpus=None, token_sha256="0" * 64)
    await store.append_many([StreamAppend(e.stream, 0, [e]) for e in [*nodes, team]])


def job(job_id: str, *, tasks: int = 2, gpus_per_task: int = 8, tp: int = 8) -> JobSubmitted:
    spec = JobSpec(
        name=job_id,
        team="team-a",
        tasks=tasks,
        gpus_per_task=gpus_per_task,
        topology=TopologySpec(tp_size=tp),
    )
    return JobSubmitted(job_id=job_id, spec=spec, submitted_by="tests")


async def submit_admitted(store: EventStore, submitted: JobSubmitted) -> None:
    admitted = JobAdmitted(job_id=submitted.job_id, queue="team-a", priority="research")
    await store.append(submitted.stream, 0, [submitted, admitted])


async def reservation(store: EventStore, job_id: str) -> GangReserved | None:
    for envelope in await store.read_stream(f"job-{job_id}"):
        if isinstance(envelope.payload, GangReserved):
            return envelope.payload
    return None


async def test_the_leader_reserves_an_admitted_job_with_an_append_carrying_its_epoch(
    settings: Settings, store: EventStore
) -> None:
    await seed_cluster(store)
    async with replica(settings, "a") as leader:
        await submit_admitted(store, job("j1"))
        await wait_until(lambda: _has_reservation(store, "j1"), what="j1 reserved", patience_s=30)
        reserved = [e for e in await store.read_stream("job-j1") if e.type == "GangReserved"]
        assert leader.service.leadership is not None
        assert [e.epoch for e in reserved] == [leader.service.leadership.epoch]
        gang = reserved[0].payload
        assert isinstance(gang, GangReserved)
        assert sum(len(rank.gpus) for rank in gang.ranks) == 16


async def test_a_leader_whose_lock_session_ends_stops_leading_and_a_replica_leads_anew(
    settings: Settings, store: EventStore
) -> None:
    await seed_cluster(store)
    async with replica(settings, "first") as first:
        await wait_until(lambda: _leads(first), what="first leads", patience_s=30)
        async with replica(settings, "second") as second:
            await asyncio.sleep(0.5)
            assert second.service.leadership is None
            assert first.service.leadership is not None
            old_epoch = first.service.leadership.epoch
            # As PostgreSQL does when the leader stops pinging (paused past the timeout).
            await first.service.leadership.conn.close()

            async def new_epoch() -> bool:
                return any(
                    r.service.leadership is not None and r.service.leadership.epoch == old_epoch + 1
                    for r in (first, second)
                )

            await wait_until(new_epoch, what="a leader at the next epoch", patience_s=30)
            # The deposed leader competes again rather than exiting: both replicas live on.
            assert not first.task.done() and not second.task.done()
            await submit_admitted(store, job("after"))
            await wait_until(
                lambda: _has_reservation(store, "after"), what="reserved by the new leader"
            )


async def test_a_leader_whose_session_is_terminated_leads_again_on_a_new_session(
    settings: Settings, store: EventStore
) -> None:
    await seed_cluster(store)
    async with replica(settings, "only") as only:
        await wait_until(lambda: _leads(only), what="it leads", patience_s=30)
        assert only.service.leadership is not None
        old_epoch = only.service.leadership.epoch
        async with store.pool.acquire() as conn:
            # What a database restart does to the lock's session.
            pid = only.service.leadership.conn.get_server_pid()
            assert await conn.fetchval("SELECT pg_terminate_backend($1)", pid)

        async def leads_anew() -> bool:
            held = only.service.leadership
            return held is not None and held.epoch == old_epoch + 1

        await wait_until(leads_anew, what="it leads at the next epoch", patience_s=30)
        assert not only.task.done()
        await submit_admitted(store, job("after"))
        await wait_until(lambda: _has_reservation(store, "after"), what="reserved after it")


async def test_a_deposed_leader_that_decides_is_fenced_and_competes_again(
    settings: Settings, store: EventStore
) -> None:
    await seed_cluster(store)
    async with replica(settings, "old", scheduler_lock_timeout_s=60) as old:
        await wait_until(lambda: _leads(old), what="old leads", patience_s=30)
        assert old.service.leadership is not None
        old_epoch = old.service.leadership.epoch
        # A new leader is elected behind the old one's back (its lock is still held, so the
        # epoch is raised directly, as a standby would after the old session died).
        async with store.pool.acquire() as conn:
            await conn.execute("SELECT leader_epoch_bump('scheduler', 'new')")
        await submit_admitted(store, job("late"))
        # Fenced, it stands by: the lock is still its own, so it soon leads at a new epoch,
        # and the job is reserved only then, by an append that carries that epoch.
        await wait_until(lambda: _has_reservation(store, "late"), what="late reserved")
        reserved = [e for e in await store.read_stream("job-late") if e.type == "GangReserved"]
        assert [e.epoch for e in reserved] == [old_epoch + 2]
        stale = await store.read_all(0, 10_000)
        assert all(e.epoch in (None, old_epoch, old_epoch + 2) for e in stale)
        assert not old.task.done()


async def test_a_cancel_committed_between_fold_and_append_is_folded_before_deciding_again(
    settings: Settings, store: EventStore
) -> None:
    """The cycle's append expects the job stream's folded version; a cancel appended after
    the fold makes it conflict, and the re-run cycle no longer reserves the job."""
    await seed_cluster(store)
    async with replica(settings, "a", scheduler_cycle_interval_s=3600) as leader:
        await wait_until(lambda: _leads(leader), what="leads", patience_s=30)
        service = leader.service
        # Freeze following: fold the submission, then cancel behind the fold's back.
        leader.stop.set()
        await asyncio.wait_for(leader.task, 30)
        submitted = job("racy")
        await submit_admitted(store, submitted)
        await service.follow()
        await store.append(submitted.stream, 2, [JobCancelRequested(job_id="racy", by="u")])
        service.leadership = await _lead_again(service, settings)
        await service.cycle()
        assert await reservation(store, "racy") is None
        assert _total(service.metrics.conflicts) >= 1
        await service.leadership.release()


async def test_a_late_start_of_a_released_rank_committed_before_the_append_keeps_its_gpus(
    settings: Settings, store: EventStore
) -> None:
    """x's gang is cancelled before its rank started; its agent starts the rank late, after the
    scheduler folded the cancel and decided y onto x's GPUs. The append of y's gang expects
    x's stream too (the late start moved it): it conflicts, the cycle sees x's rank on those
    GPUs and does not bind them twice (the audit's invariant 1)."""
    await seed_cluster(store, "1x8:1:1")
    async with replica(settings, "a", scheduler_cycle_interval_s=0.1) as leader:
        await wait_until(lambda: _leads(leader), what="leads", patience_s=30)
        service = leader.service
        x = job("x", tasks=1)
        await submit_admitted(store, x)
        await wait_until(lambda: _has_reservation(store, "x"), what="x reserved", patience_s=30)
        await store.append(x.stream, None, [JobCancelRequested(job_id="x", by="u")])
        await wait_until(lambda: _has(store, "x", JobCancelled), what="x cancelled", patience_s=30)
        leader.stop.set()
        await asyncio.wait_for(leader.task, 30)
        y = job("y", tasks=1)
        await submit_admitted(store, y)
        await service.follow()
        gang = await reservation(store, "x")
        assert gang is not None
        late = TaskStarted(job_id="x", attempt=gang.attempt, rank=0, node_id="n0000")
        await store.append(x.stream, None, [late])  # behind the fold's back
        service.leadership = await _lead_again(service, settings)
        await service.cycle()
        assert await reservation(store, "y") is None
        assert _total(service.metrics.conflicts) >= 1
        await service.leadership.release()


async def _has(store: EventStore, job_id: str, kind: type[Event]) -> bool:
    return any(isinstance(e.payload, kind) for e in await store.read_stream(f"job-{job_id}"))


async def test_events_folded_after_a_cycle_decided_wake_the_next_cycle_at_once(
    settings: Settings, store: EventStore
) -> None:
    """A job admitted while a cycle decides is folded after the cycle's append (which lands
    after it); the next cycle must not wait for the timer (an hour here) to place it."""
    await seed_cluster(store)
    async with replica(settings, "a", scheduler_cycle_interval_s=3600) as leader:
        await wait_until(lambda: _leads(leader), what="leads", patience_s=30)
        service = leader.service
        leader.stop.set()
        await asyncio.wait_for(leader.task, 30)
        # Which notifications reach the replica before the cycle's own catch-up clears the
        # wake-up is a race; here none reaches it after (its LISTEN connection stays open but
        # deaf), so the catch-up is all it has.
        await service._listen()
        assert service._listener is not None
        await service._listener.remove_listener(NOTIFY_CHANNEL, service._on_notify)
        await submit_admitted(store, job("first"))
        await service.follow()
        # Committed after the fold, before the cycle's append.
        await submit_admitted(store, job("second"))
        service.leadership = await _lead_again(service, settings)
        [reserved] = await service.cycle()
        assert reserved.stream == "job-first"
        assert await reservation(store, "second") is None
        stop = asyncio.Event()
        never = asyncio.get_running_loop().create_future()
        # Bounded patience, not a timing: without the wake-up it would wait an hour.
        await asyncio.wait_for(service._wait(stop, never, seconds=3600), 30)
        await service.cycle()
        assert await reservation(store, "second") is not None
        never.cancel()
        await service.leadership.release()


async def test_a_flood_past_the_cycles_bound_is_considered_by_cycles_run_at_once(
    settings: Settings, store: EventStore
) -> None:
    """A cycle considers one newly queued job here: the one it leaves is considered by the
    next cycle at once, not after the cycle timer (an hour here)."""
    await seed_cluster(store)
    async with replica(
        settings, "a", scheduler_cycle_interval_s=3600, scheduler_max_new_jobs_per_cycle=1
    ) as leader:
        await wait_until(lambda: _leads(leader), what="leads", patience_s=30)
        service = leader.service
        leader.stop.set()
        await asyncio.wait_for(leader.task, 30)
        await submit_admitted(store, job("first"))
        await submit_admitted(store, job("second"))
        await service.follow()
        service.leadership = await _lead_again(service, settings)
        decided = await service.cycle()
        assert [envelope.stream for envelope in decided] == ["job-first", "job-second"]
        assert await reservation(store, "second") is None
        assert service._until_next_cycle() < 1
        await service.cycle()
        assert await reservation(store, "second") is not None
        assert service._until_next_cycle() > 1
        await service.leadership.release()


async def test_snapshot_plus_tail_equals_full_replay(settings: Settings, store: EventStore) -> None:
    await seed_cluster(store)
    async with replica(settings, "a", scheduler_snapshot_every=5) as leader:
        for i in range(12):
            await submit_admitted(store, job(f"s{i}", tasks=1))
        await wait_until(lambda: _has_reservation(store, "s11"), what="all reserved", patience_s=30)
        leader.stop.set()
        assert await asyncio.wait_for(leader.task, 30) == 0
    policy = SchedulingPolicy()
    snapshots = SnapshotStore(store.pool, code_version(policy))
    assert await snapshots.load(max_position=await store.head()) is not None
    for i in range(12, 15):
        await submit_admitted(store, job(f"s{i}", tasks=1))
    report = await verify_replay(store, policy, snapshots)
    assert report.snapshot_stored and report.events_tail >= 6
    assert report.ok, report.differences


async def test_a_snapshot_of_another_code_version_is_never_loaded(
    settings: Settings, store: EventStore
) -> None:
    await seed_cluster(store)
    policy = SchedulingPolicy()
    folded = Folded.empty(policy)
    await rebuild_into(store, folded)
    await SnapshotStore(store.pool, "older-code").save(folded)
    rebuilt = await rebuild(
        store, policy, snapshots=SnapshotStore(store.pool, code_version(policy))
    )
    assert rebuilt.snapshot_position is None
    assert rebuilt.events_replayed == await store.head()


async def rebuild_into(store: EventStore, folded: Folded) -> None:
    async for batch in store.iter_raw(folded.position):
        folded.fold_raw(batch)


async def _has_reservation(store: EventStore, job_id: str) -> bool:
    return await reservation(store, job_id) is not None


async def _leads(r: Replica) -> bool:
    return r.service.leadership is not None


async def _lead_again(service: SchedulerService, settings: Settings) -> Leadership:
    leadership = await acquire_leadership(service.store, settings.pg_dsn, "again")
    assert leadership is not None
    return leadership


def _total(counter: Counter) -> float:
    return sum(
        sample.value
        for metric in counter.collect()
        for sample in metric.samples
        if sample.name.endswith("_total")
    )


async def test_a_replay_reading_ahead_while_folding_gives_the_state_of_a_plain_fold(
    settings: Settings, store: EventStore
) -> None:
    await seed_cluster(store)
    for i in range(40):
        await submit_admitted(store, job(f"p{i}", tasks=1))
    policy = SchedulingPolicy()
    plain = Folded.empty(policy)
    await rebuild_into(store, plain)
    # A batch size below the log's length takes the read-ahead path.
    pipelined = await rebuild(store, policy, batch_size=10)
    assert pipelined.folded.position == await store.head()
    assert differences(plain, pipelined.folded) == []


async def test_the_leaders_live_state_equals_a_full_replay_of_the_log(
    settings: Settings, store: EventStore
) -> None:
    await seed_cluster(store)
    async with replica(settings, "a") as leader:
        for i in range(10):
            await submit_admitted(store, job(f"l{i}", tasks=2))
            if i % 3 == 0:
                cancel = JobCancelRequested(job_id=f"l{i}", by="u")
                await store.append(cancel.stream, None, [cancel])

        async def settled() -> bool:
            for i in range(10):
                types = {e.type for e in await store.read_stream(f"job-l{i}")}
                if ("JobCancelled" if i % 3 == 0 else "GangReserved") not in types:
                    return False
            return True

        await wait_until(settled, what="jobs reserved or cancelled", patience_s=30)
        leader.stop.set()
        assert await asyncio.wait_for(leader.task, 30) == 0
        live = leader.service.folded
    replayed = await rebuild(store, SchedulingPolicy())
    assert live.position == replayed.folded.position
    assert differences(replayed.folded, live) == []


async def test_a_job_past_its_max_runtime_is_failed_by_a_timed_cycle_without_new_events(
    settings: Settings, store: EventStore
) -> None:
    await seed_cluster(store)
    spec = JobSpec(name="short", team="team-a", tasks=1, gpus_per_task=1, max_runtime_s=1.0)
    submitted = JobSubmitted(job_id="short", spec=spec, submitted_by="tests")
    async with replica(settings, "a", scheduler_cycle_interval_s=0.5):
        await submit_admitted(store, submitted)
        await wait_until(lambda: _has_reservation(store, "short"), what="reserved")
        gang = await reservation(store, "short")
        assert gang is not None
        started = TaskStarted(job_id="short", attempt=1, rank=0, node_id=gang.ranks[0].node_id)
        await store.append(started.stream, None, [started])

        async def asked_to_stop() -> bool:
            history = await store.read_stream("job-short")
            return any(isinstance(e.payload, PreemptionRequested) for e in history)

        # Past the limit the gang is checkpointed and stopped first, as its agent would.
        await wait_until(asked_to_stop, what="asked to checkpoint and stop", patience_s=30)
        exited = TaskExited(
            job_id="short",
            attempt=1,
            rank=0,
            node_id=gang.ranks[0].node_id,
            exit_code=0,
            reason="preempted",
        )
        await store.append(exited.stream, None, [exited])

        async def failed() -> bool:
            history = await store.read_stream("job-short")
            return any(
                isinstance(e.payload, JobFailed) and "max_runtime" in e.payload.reason
                for e in history
            )

        await wait_until(failed, what="failed for its max runtime", patience_s=30)


async def test_an_unreadable_snapshot_falls_back_to_a_full_replay(
    settings: Settings, store: EventStore
) -> None:
    await seed_cluster(store)
    policy = SchedulingPolicy()
    snapshots = SnapshotStore(store.pool, code_version(policy))
    folded = Folded.empty(policy)
    await rebuild_into(store, folded)
    await snapshots.save(folded)
    async with store.pool.acquire() as conn:
        await conn.execute("UPDATE scheduler_snapshots SET state = 'not a pickle'::bytea")
    rebuilt = await rebuild(store, policy, snapshots=snapshots)
    assert rebuilt.snapshot_position is None
    assert differences(folded, rebuilt.folded) == []
