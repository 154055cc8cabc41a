"""The agent starts a gang's ranks in the background: a large gang neither holds back other
jobs' launches nor keeps starting ranks after its attempt is released (issue 12: a cancelled
4,096-rank CPU-only gang went on launching for minutes and stalled every other launch)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TypeVar

import pytest

from schemas.base import Event
from schemas.jobs import (
    GangReserved,
    JobCancelled,
    JobSpec,
    JobSubmitted,
    RankPlacement,
    TaskExited,
    TaskStarted,
)
from services.agent.agent import Agent
from services.agent.ranks import PID_FILE, RankKey, launch
from services.runtime import EventStore, Settings
from tests.agent.test_agent_integration import make_agent, until
from tests.integration.conftest import settings, stack, store

pytestmark = pytest.mark.integration
__all__ = ["settings", "stack", "store"]

# Each rank needs at least one round trip to the log (its TaskStarted): far more than the
# handful a cancel takes to arrive, so a launch that heeds the cancel starts far fewer.
LARGE = 64


async def submit_cpu_only(store: EventStore, job_id: str, ranks: int) -> GangReserved:
    spec = JobSpec(
        name="prep",
        team="ml",
        tasks=ranks,
        gpus_per_task=0,
        cpus_per_task=0.1,
        command=["sleep", "600"],
    )
    gang = GangReserved(
        job_id=job_id,
        attempt=1,
        ranks=[RankPlacement(rank=r, node_id="n0000", gpus=[]) for r in range(ranks)],
    )
    await store.append(
        f"job-{job_id}", None, [JobSubmitted(job_id=job_id, spec=spec, submitted_by="t")]
    )
    return gang


async def deliver(agent: Agent, store: EventStore, job_id: str, event: Event) -> None:
    """Append the event to the job's stream and hand it to the agent, as its consumer would."""
    [envelope] = await store.append(f"job-{job_id}", None, [event])
    async with store.pool.acquire() as conn:
        await agent.handlers()[envelope.type](envelope, conn)


E = TypeVar("E", bound=Event)


async def events_of(store: EventStore, job_id: str, kind: type[E]) -> list[E]:
    stream = await store.read_stream(f"job-{job_id}")
    return [e.payload for e in stream if isinstance(e.payload, kind)]


@pytest.fixture
async def agent(settings: Settings, store: EventStore, tmp_path: Path) -> AsyncIterator[Agent]:
    running = make_agent(settings, store, tmp_path)
    yield running
    await running.shutdown()


async def test_a_cancel_during_a_large_launch_starts_no_more_ranks_and_stops_those_started(
    agent: Agent, store: EventStore
) -> None:
    gang = await submit_cpu_only(store, "big", LARGE)
    await deliver(agent, store, "big", gang)
    await deliver(agent, store, "big", JobCancelled(job_id="big", attempt=1, reason="user"))
    await agent.launches_done()

    started = await events_of(store, "big", TaskStarted)
    assert len(started) < LARGE

    async def every_started_rank_exited() -> bool:
        return len(await events_of(store, "big", TaskExited)) == len(started)

    await until(every_started_rank_exited, "every started rank stopped")
    assert not [rank for rank in agent.ranks.values() if rank.running]


async def test_a_large_launch_does_not_hold_back_another_jobs_ranks(
    agent: Agent, store: EventStore
) -> None:
    await deliver(agent, store, "big", await submit_cpu_only(store, "big", LARGE))
    await deliver(agent, store, "small", await submit_cpu_only(store, "small", 1))

    async def small_started() -> bool:
        return bool(await events_of(store, "small", TaskStarted))

    await until(small_started, "the small job's rank started")
    assert len(await events_of(store, "big", TaskStarted)) < LARGE
    await agent.launches_done()
    assert len(await events_of(store, "big", TaskStarted)) == LARGE


async def test_a_redelivered_reservation_during_its_launch_starts_each_rank_once(
    agent: Agent, store: EventStore
) -> None:
    gang = await submit_cpu_only(store, "twice", 8)
    [envelope] = await store.append("job-twice", None, [gang])
    for _ in range(2):
        async with store.pool.acquire() as conn:
            await agent.handlers()[envelope.type](envelope, conn)
    await agent.launches_done()
    started = await events_of(store, "twice", TaskStarted)
    assert sorted(e.rank for e in started) == list(range(8))


async def test_a_gang_whose_launch_a_crash_cut_short_is_started_by_the_restarted_agent(
    agent: Agent, store: EventStore, settings: Settings, tmp_path: Path
) -> None:
    """Its GangReserved was consumed before any rank started: no one delivers it again, so
    the successor's reconcile starts it rather than leave it to the launch timeout."""
    await deliver(agent, store, "cut", await submit_cpu_only(store, "cut", 4))
    for task in list(agent._launch_tasks):  # the agent dies before its launch ran at all
        task.cancel()
    await agent.launches_done()
    assert not await events_of(store, "cut", TaskStarted)

    successor = make_agent(settings, store, tmp_path)
    try:
        assert await successor.reconcile() == 0  # no rank of a predecessor to stop
        await successor.launches_done()
        started = await events_of(store, "cut", TaskStarted)
        assert sorted(e.rank for e in started) == [0, 1, 2, 3]
        assert await successor.reconcile() == 4  # a third agent would stop them: they ran
    finally:
        await successor.shutdown()


async def test_a_restarted_agent_does_not_resume_a_gang_that_was_released(
    agent: Agent, store: EventStore, settings: Settings, tmp_path: Path
) -> None:
    await deliver(agent, store, "gone", await submit_cpu_only(store, "gone", 2))
    for task in list(agent._launch_tasks):
        task.cancel()
    await agent.launches_done()
    await store.append("job-gone", None, [JobCancelled(job_id="gone", attempt=1, reason="user")])

    successor = make_agent(settings, store, tmp_path)
    try:
        await successor.reconcile()
        await successor.launches_done()
        assert not await events_of(store, "gone", TaskStarted)
    finally:
        await successor.shutdown()


async def test_a_rank_started_but_never_recorded_is_stopped_and_its_gang_started_once(
    store: EventStore, settings: Settings, tmp_path: Path
) -> None:
    """The crashed agent spawned the rank and died before its TaskStarted reached the log:
    the log knows nothing of it, so only the restarted agent can stop it (found by the
    hardware chaos run: such a rank ran on beside its gang's next attempt)."""
    gang = await submit_cpu_only(store, "stray", 1)
    await store.append("job-stray", None, [gang])
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "GANGWAY_JOB_ID": "stray",
        "GANGWAY_ATTEMPT": "1",
        "GANGWAY_RANK": "0",
        "GANGWAY_NODE_ID": "n0000",
    }
    workdir = tmp_path / "work" / "stray" / "a1" / "rank-0"
    env["GANGWAY_CHECKPOINT_REQUEST"] = str(workdir / "checkpoint-request.json")
    orphan = await launch(RankKey("stray", 1, 0), gang.ranks[0], 1, ["sleep", "600"], env, workdir)
    (workdir / PID_FILE).unlink()  # it died even before the pid file was written

    successor = make_agent(settings, store, tmp_path)
    try:
        assert await successor.reconcile() == 1
        assert await asyncio.wait_for(orphan.process.wait(), 30) == -9
        await successor.launches_done()
        started = await events_of(store, "stray", TaskStarted)
        assert [e.rank for e in started] == [0]
        [rank] = [r for r in successor.ranks.values() if r.running]
        assert rank.pid != orphan.pid
    finally:
        await successor.shutdown()


async def submit_on_gpu_0(store: EventStore, job_id: str, command: list[str]) -> GangReserved:
    spec = JobSpec(name="t", team="ml", tasks=1, gpus_per_task=1, command=command)
    await store.append(
        f"job-{job_id}", None, [JobSubmitted(job_id=job_id, spec=spec, submitted_by="t")]
    )
    return GangReserved(
        job_id=job_id, attempt=1, ranks=[RankPlacement(rank=0, node_id="n0000", gpus=[0])]
    )


async def test_a_rank_waits_for_its_gpu_until_a_rank_still_on_it_exits(
    agent: Agent, store: EventStore
) -> None:
    """The scheduler decides on the log as it had folded it and checks, when it appends, only
    the streams it writes: a rank its agent started just after its gang was cancelled (a late
    TaskStarted on that job's stream) did not stop the next cycle, decided before it, from
    giving the same GPU to another gang. Seen on a live stack under a storm of cancels: two
    ranks of two jobs ran on one GPU for about a second (audit: "a GPU is bound to at most
    one gang"). The agent knows which GPUs its ranks hold: a rank waits for them."""
    slow = ["sh", "-c", "trap '' TERM; sleep 600"]  # takes its stop timeout to die
    await deliver(agent, store, "old", await submit_on_gpu_0(store, "old", slow))
    await agent.launches_done()
    await deliver(agent, store, "old", JobCancelled(job_id="old", attempt=1, reason="user"))
    await deliver(agent, store, "new", await submit_on_gpu_0(store, "new", ["sleep", "600"]))

    async def new_started() -> bool:
        return bool(await events_of(store, "new", TaskStarted))

    await until(new_started, "the new job's rank started")
    exits = await events_of(store, "old", TaskExited)
    assert exits, "the new job's rank started while the old one still ran on GPU 0"
    [exited] = exits
    old_exit = [
        e.position for e in await store.read_stream("job-old") if isinstance(e.payload, TaskExited)
    ]
    new_start = [
        e.position for e in await store.read_stream("job-new") if isinstance(e.payload, TaskStarted)
    ]
    assert exited.exit_code != 0
    assert (old_exit[0] or 0) < (new_start[0] or 0), (old_exit, new_start)
