"""A preemption that reaches the agent while it is still starting the gang's ranks."""

from __future__ import annotations

import pytest

from schemas.jobs import PreemptionRequested, TaskExited
from services.agent.agent import Agent
from services.runtime import EventStore
from tests.agent.test_agent_integration import JOB, agent, job_events, reserve, until
from tests.integration.conftest import settings, stack, store

pytestmark = pytest.mark.integration
__all__ = ["agent", "settings", "stack", "store"]


async def test_a_preemption_during_the_launch_evicts_the_gang_once_started(
    agent: Agent, store: EventStore
) -> None:
    """attack12: a gang reserved, then preempted at once (its preemptor's guarantee), while
    the agent was starting its ranks: the agent had no rank running yet and dropped the
    request; the ranks started and ran on until the scheduler's grace (120 s) ran out, and the
    preemptor waited all that time for GPUs the eviction should have freed in seconds."""
    reserved = await reserve(store, ["sleep", "600"], ["n0000", "n0001"])
    preempt = PreemptionRequested(
        job_id=JOB, attempt=1, preemptor_job_id="other", reason="test", grace_s=5
    )
    [request] = await store.append(f"job-{JOB}", None, [preempt])
    handlers = agent.handlers()
    async with agent.store.pool.acquire() as conn:
        await handlers[reserved.type](reserved, conn)  # its ranks start in the background
        await handlers[request.type](request, conn)  # before any of them is running
    await agent.launches_done()

    async def both_evicted() -> bool:
        exits = [e for e in await job_events(store) if isinstance(e, TaskExited)]
        return len(exits) == 2 and all(e.reason == "preempted" for e in exits)

    await until(both_evicted, "both ranks evicted")
