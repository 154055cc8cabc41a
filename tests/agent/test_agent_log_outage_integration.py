"""A gang's launch rides out an event log that goes away right after its GangReserved.

Found by an adversarial run (PostgreSQL restarted under a stream of submissions): the
background launch died on its first read of the log, its ranks stayed marked launched, the
retried batch skipped the gang, and the job sat `reserved`, holding its GPUs with no rank
running, until the launch timeout requeued it. The log goes away here for real: the agent's
pool reaches PostgreSQL through a TCP proxy the test cuts."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from schemas.jobs import (
    GangReserved,
    JobCancelled,
    JobSpec,
    JobSubmitted,
    RankPlacement,
    TaskExited,
    TaskStarted,
)
from services.agent.agent import LAUNCH_FAILED_EXIT_CODE, Agent
from services.runtime import EventStore, Settings
from services.runtime.store import create_pool
from tests.agent.test_agent_integration import make_agent, until
from tests.agent.test_agent_launch_integration import events_of, submit_cpu_only
from tests.integration.conftest import proxy, settings, stack, store
from tests.integration.proxy import TcpProxy

pytestmark = pytest.mark.integration
__all__ = ["proxy", "settings", "stack", "store"]


@pytest.fixture
async def agent_store(settings: Settings, proxy: tuple[TcpProxy, str]) -> AsyncIterator[EventStore]:
    """The agent's own store, whose every connection goes through the proxy."""
    through = EventStore(await create_pool(settings, proxy[1]), producer="agent", owns_pool=True)
    yield through
    await proxy[0].restore()  # a pool closes cleanly only over a live connection
    await through.close()


@pytest.fixture
async def agent(
    settings: Settings, agent_store: EventStore, tmp_path: Path
) -> AsyncIterator[Agent]:
    running = make_agent(settings, agent_store, tmp_path)
    yield running
    await running.shutdown()


async def test_a_launch_cut_off_from_the_log_starts_its_rank_once_the_log_is_back(
    agent: Agent,
    agent_store: EventStore,
    store: EventStore,
    proxy: tuple[TcpProxy, str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    cut = proxy[0]
    gang = await submit_cpu_only(store, "cutoff", 1)
    [envelope] = await store.append("job-cutoff", None, [gang])
    caplog.set_level(logging.WARNING, logger="services.agent.agent")

    async with store.pool.acquire() as conn:
        await agent.handlers()[envelope.type](envelope, conn)
    # The log goes away before the launch in the background has read anything.
    await cut.cut()

    async def lost_or_given_up() -> bool:
        return "lost" in caplog.text or not agent._launch_tasks

    await until(lost_or_given_up, "the launch noticed the log was away")
    await cut.restore()
    await agent.launches_done()

    started = await events_of(store, "cutoff", TaskStarted)
    assert [(e.attempt, e.rank) for e in started] == [(1, 0)]
    assert [key.rank for key, rank in agent.ranks.items() if rank.running] == [0]
    assert "recovered" in caplog.text  # one line when lost, one when back

    # The consumer's batch, retried once the log is back, hands the gang over again.
    async with store.pool.acquire() as conn:
        await agent.handlers()[envelope.type](envelope, conn)
    await agent.launches_done()
    assert len(await events_of(store, "cutoff", TaskStarted)) == 1


async def test_a_launch_waiting_for_the_log_starts_nothing_once_its_attempt_is_cancelled(
    agent: Agent,
    store: EventStore,
    proxy: tuple[TcpProxy, str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    cut = proxy[0]
    gang = await submit_cpu_only(store, "gone", 2)
    [envelope] = await store.append("job-gone", None, [gang])
    caplog.set_level(logging.WARNING, logger="services.agent.agent")
    async with store.pool.acquire() as conn:
        await agent.handlers()[envelope.type](envelope, conn)
    await cut.cut()

    async def lost() -> bool:
        return "lost" in caplog.text

    await until(lost, "the launch noticed the log was away")
    [cancel] = await store.append(
        "job-gone", None, [JobCancelled(job_id="gone", attempt=1, reason="user")]
    )
    async with store.pool.acquire() as conn:
        await agent.handlers()[cancel.type](cancel, conn)
    await agent.launches_done()  # the wait ends with the attempt, not with the outage
    await cut.restore()
    assert not await events_of(store, "gone", TaskStarted)
    assert not agent.ranks


class CutWhenLogged(logging.Handler):
    """Cuts the log away at the very moment the agent logs `marker`: between the agent's last
    read and the append it then makes, with no await in between for a test to step into."""

    def __init__(self, proxy: TcpProxy, marker: str) -> None:
        super().__init__(logging.WARNING)
        self.proxy = proxy
        self.marker = marker

    def emit(self, record: logging.LogRecord) -> None:
        if self.marker in record.getMessage():
            self.proxy.cut_now()


async def test_an_agent_stopped_while_recording_a_failed_launch_in_an_outage_stops_at_once(
    agent: Agent,
    agent_store: EventStore,
    store: EventStore,
    settings: Settings,
    proxy: tuple[TcpProxy, str],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Found by the last adversarial review: the failure waited for the log without end, so
    the agent's shutdown did too. It now gives up the record once stopping, and the next
    agent's reconcile starts the gang again, whose launch fails again and is recorded."""
    cut = proxy[0]
    caplog.set_level(logging.WARNING, logger="services.agent.agent")
    spec = JobSpec(
        name="prep",
        team="ml",
        tasks=1,
        gpus_per_task=0,
        cpus_per_task=0.1,
        command=[str(tmp_path / "no-such-program")],
    )
    submitted = JobSubmitted(job_id="broken", spec=spec, submitted_by="t")
    gang = GangReserved(
        job_id="broken", attempt=1, ranks=[RankPlacement(rank=0, node_id="n0000", gpus=[])]
    )
    [_, envelope] = await store.append("job-broken", None, [submitted, gang])
    cutter = CutWhenLogged(cut, "could not start")
    logging.getLogger("services.agent.agent").addHandler(cutter)
    try:
        async with store.pool.acquire() as conn:
            await agent.handlers()[envelope.type](envelope, conn)

        async def lost() -> bool:
            return "lost" in caplog.text

        await until(lost, "the failure's record met the outage")
        # A deadlock guard, not a timing: before the fix this waited until the log came back.
        await asyncio.wait_for(agent.shutdown(), 60)
    finally:
        logging.getLogger("services.agent.agent").removeHandler(cutter)
    assert not await events_of(store, "broken", TaskExited)  # nothing recorded meanwhile

    await cut.restore()
    successor = make_agent(settings, agent_store, tmp_path)
    await successor.reconcile()
    await successor.launches_done()
    started = await events_of(store, "broken", TaskStarted)
    [exited] = await events_of(store, "broken", TaskExited)
    assert [(e.attempt, e.rank) for e in started] == [(1, 0)]
    assert (exited.attempt, exited.rank, exited.exit_code) == (1, 0, LAUNCH_FAILED_EXIT_CODE)
    assert exited.permanent
    assert exited.reason == f"launch failed on n0000 rank 0: no such program: {spec.command[0]}"
    await successor.shutdown()
