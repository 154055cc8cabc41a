"""A real agent keeps a finished attempt's working directory and log for its retention
(GANGWAY_LOG_RETENTION_S), then deletes them; a rank that still runs keeps its own."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from schemas.jobs import TaskExited
from services.agent.agent import Agent
from services.agent.settings import AgentSettings
from services.runtime import EventStore, Settings
from tests.agent.test_agent_integration import NODES, handle, job_events, reserve, until
from tests.integration.conftest import settings, stack, store

__all__ = ["settings", "stack", "store"]

pytestmark = pytest.mark.integration


async def test_the_logs_of_an_ended_attempt_go_after_the_retention(
    settings: Settings, store: EventStore, tmp_path: Path
) -> None:
    agent = Agent(
        AgentSettings(
            **{
                **settings.model_dump(),
                "work_dir": tmp_path / "work",
                "checkpoint_root": tmp_path / "checkpoints",
                "fault_dir": tmp_path / "faults",
                "stop_timeout_s": 2.0,
                # A tiny retention, checked often.
                "log_retention_s": 0.3,
                "log_retention_check_s": 0.05,
            },
            _env_file=None,
        ),
        store,
        NODES,
    )
    stop = asyncio.Event()
    retention = asyncio.create_task(agent.retention_loop(stop))
    try:
        # Rank 0 ends at once; rank 1 runs until told to stop.
        envelope = await reserve(
            store, ["sh", "-c", 'echo bye; [ "$RANK" = 0 ] || sleep 60'], ["n0000", "n0001"]
        )
        await handle(agent, envelope)
        attempt_dir = agent.work_dir / "j1" / "a1"

        async def rank_0_exited() -> bool:
            events = await job_events(store)
            return any(isinstance(e, TaskExited) and e.rank == 0 for e in events)

        await until(rank_0_exited, "rank 0 exited")
        # Rank 1 still runs: the attempt is not over, its directory stays past the retention.
        await asyncio.sleep(1.0)
        assert (attempt_dir / "rank-1" / "rank.log").exists()
        assert agent.attempt_running("j1", 1)

        await agent.shutdown()  # stops rank 1: the attempt is over

        async def gone() -> bool:
            return not attempt_dir.exists()

        await until(gone, "the ended attempt's directory deleted")
        assert not (agent.work_dir / "j1").exists()
    finally:
        stop.set()
        await retention
        await agent.shutdown()
