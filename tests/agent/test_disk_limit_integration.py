"""A rank's disk is bounded (services/agent/disk.py): found by the hostile-tenant run
(2026-11-23), a rank's output and files grew until the node's filesystem was full, which on a
`make up` installation also holds PostgreSQL's data and Kafka's log. A real agent now kills a
rank whose working directory holds more than its limit, and a file that reaches the limit
(its output first of all) kills the rank; either way its exit says why, as permanent: the job
fails at once instead of filling the disk again on every retry."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from schemas.jobs import GangReserved, JobSpec, JobSubmitted, RankPlacement, TaskExited
from services.agent.agent import Agent
from services.agent.disk import DISK_LIMIT_REASON, MIB
from services.agent.settings import AgentSettings
from services.runtime import EventStore, Settings
from tests.agent.test_agent_integration import JOB, NODES, handle, job_events, until
from tests.integration.conftest import settings, stack, store

__all__ = ["settings", "stack", "store"]

pytestmark = pytest.mark.integration


@pytest.fixture
async def agent(settings: Settings, store: EventStore, tmp_path: Path) -> AsyncIterator[Agent]:
    running = Agent(
        AgentSettings(
            **{
                **settings.model_dump(),
                "work_dir": tmp_path / "work",
                "checkpoint_root": tmp_path / "checkpoints",
                "fault_dir": tmp_path / "faults",
                "stop_timeout_s": 2.0,
                # The operator's default and cap: 4 MB, at most 8.
                "rank_disk_mb": 4,
                "rank_disk_max_mb": 8,
                "rank_disk_max_entries": 1000,
            },
            _env_file=None,
        ),
        store,
        NODES,
    )
    yield running
    await running.shutdown()


async def start(agent: Agent, store: EventStore, script: str, **spec: object) -> None:
    job = JobSpec.model_validate(
        {"name": "t", "team": "ml", "gpus_per_task": 8, "command": ["sh", "-c", script], **spec}
    )
    gang = GangReserved(
        job_id=JOB, attempt=1, ranks=[RankPlacement(rank=0, node_id="n0000", gpus=list(range(8)))]
    )
    await store.append(f"job-{JOB}", None, [JobSubmitted(job_id=JOB, spec=job, submitted_by="t")])
    await handle(agent, (await store.append(f"job-{JOB}", None, [gang]))[0])


async def the_exit(store: EventStore) -> TaskExited:
    async def exited() -> list[TaskExited]:
        return [e for e in await job_events(store) if isinstance(e, TaskExited)]

    await until(exited, "the rank's exit recorded")
    [event] = await exited()
    return event


async def test_a_rank_whose_files_outgrow_its_disk_limit_is_killed_with_the_reason(
    agent: Agent, store: EventStore
) -> None:
    # Files of 1 MB each (none past the limit by itself), 6 of them: 6 MB of its 2 MB.
    await start(
        agent,
        store,
        "for i in 1 2 3 4 5 6; do head -c 1000000 /dev/urandom > f$i; done; "
        "echo written; sleep 600",
        disk_mb_per_task=2,
    )
    [rank] = agent.ranks.values()
    assert rank.disk_limit is not None and rank.disk_limit.bytes == 2 * MIB

    async def written() -> bool:
        log = rank.workdir / "rank.log"
        return log.exists() and "written" in log.read_text()

    await until(written, "the rank wrote its files")
    assert await agent.check_disks() == [rank.key]
    event = await the_exit(store)
    assert event.exit_code != 0
    assert event.reason is not None and event.reason.startswith(DISK_LIMIT_REASON), event.reason
    assert "2 MB" in event.reason
    assert event.permanent  # the retry policy fails the job at once


async def test_a_rank_printing_without_end_dies_at_its_disk_limit(
    agent: Agent, store: EventStore
) -> None:
    # Asking more than the operator's cap (8 MB) gets the cap. `yes` fills rank.log until the
    # write past the limit kills it (SIGXFSZ), before any round of measuring.
    await start(agent, store, "yes gangway", disk_mb_per_task=100)
    event = await the_exit(store)
    assert event.exit_code != 0
    assert event.reason is not None and event.reason.startswith(DISK_LIMIT_REASON), event.reason
    assert event.permanent
    [log] = (agent.work_dir / JOB).glob("a1/rank-0/rank.log")
    assert 4 * MIB < log.stat().st_size <= 8 * MIB


async def test_a_rank_within_its_limit_runs_on(agent: Agent, store: EventStore) -> None:
    await start(agent, store, "head -c 1000000 /dev/urandom > f; echo ok; sleep 600")
    [rank] = agent.ranks.values()

    async def written() -> bool:
        log = rank.workdir / "rank.log"
        return log.exists() and "ok" in log.read_text()

    await until(written, "the rank wrote its file")
    assert await agent.check_disks() == []
    await asyncio.sleep(0.2)
    assert rank.running


async def test_a_rank_filling_its_jobs_checkpoint_directory_is_killed_with_the_reason(
    agent: Agent, store: EventStore
) -> None:
    """The job's checkpoint directory is the rank's to write too (its shards): it may hold the
    limits of the job's ranks on the node together (one rank's 2 MB here), not without end."""
    checkpoints = agent.root_dir / JOB
    await start(
        agent,
        store,
        f"mkdir -p {checkpoints}; "
        f"for i in 1 2 3; do head -c 1000000 /dev/urandom > {checkpoints}/f$i; done; "
        "echo written; sleep 600",
        disk_mb_per_task=2,
    )
    [rank] = agent.ranks.values()

    async def written() -> bool:
        log = rank.workdir / "rank.log"
        return log.exists() and "written" in log.read_text()

    await until(written, "the rank wrote its files")
    assert await agent.check_disks() == [rank.key]
    event = await the_exit(store)
    assert event.reason is not None and event.reason.startswith(DISK_LIMIT_REASON), event.reason
    assert "checkpoint directory" in event.reason
    assert event.permanent


async def test_a_rank_holding_deleted_files_open_is_killed_with_the_reason(
    agent: Agent, store: EventStore
) -> None:
    """Found by the attack round (2026-11-23): a file the rank deleted but holds open keeps its
    blocks, which no walk of its working directory sees. Three such files of 1 MB (none past
    `RLIMIT_FSIZE` by itself) held 3 MB of a 2 MB limit, and with as many descriptors as it
    may open, a rank held its limit's worth a thousand times over, unseen."""
    await start(
        agent,
        store,
        "exec 3>f1 4>f2 5>f3; rm f1 f2 f3; "
        "for fd in 3 4 5; do head -c 1000000 /dev/urandom >&$fd; done; "
        "echo written; sleep 600",
        disk_mb_per_task=2,
    )
    [rank] = agent.ranks.values()

    async def written() -> bool:
        log = rank.workdir / "rank.log"
        return log.exists() and "written" in log.read_text()

    await until(written, "the rank wrote its files")
    assert sorted(p.name for p in rank.workdir.iterdir()) == ["rank.log", "rank.pid"]
    assert await agent.check_disks() == [rank.key]
    event = await the_exit(store)
    assert event.reason is not None and event.reason.startswith(DISK_LIMIT_REASON), event.reason
    assert "deleted but holds open" in event.reason
    assert event.permanent


async def test_a_rank_holding_more_descriptors_than_files_allowed_is_killed(
    agent: Agent, store: EventStore
) -> None:
    """Looking through the rank's descriptors is bounded like the walk (1,000 entries here):
    a rank holding more cannot make the agent stat each of them every round, nor hide a
    deleted file behind them; it counts as past its limit."""
    await start(
        agent,
        store,
        "python3 -c \"import os, time; fd = os.open('f', os.O_CREAT | os.O_WRONLY); "
        "[os.dup(fd) for _ in range(1100)]; print('written', flush=True); time.sleep(600)\"",
        disk_mb_per_task=2,
    )
    [rank] = agent.ranks.values()

    async def written() -> bool:
        log = rank.workdir / "rank.log"
        return log.exists() and "written" in log.read_text()

    await until(written, "the rank opened its descriptors")
    assert await agent.check_disks() == [rank.key]
    event = await the_exit(store)
    assert event.reason is not None and event.reason.startswith(DISK_LIMIT_REASON), event.reason
    assert "could not be measured" in event.reason
