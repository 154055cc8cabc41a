"""A rank the kernel's OOM killer ends is recorded as out of memory; any other end is not.

The integration tests run a real rank into a real memory limit (a memory cgroup the test makes,
which needs root and a writable cgroup file system) and read the TaskExited the agent records.
"""

from __future__ import annotations

import asyncio
import contextlib
import shlex
import signal
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from schemas.jobs import GangReserved, JobSpec, JobSubmitted, RankPlacement, TaskExited
from services.agent.agent import Agent
from services.agent.exits import OOM_REASON, killed_for_memory, oom_kill_count
from services.agent.isolation import CGROUP_ROOT
from services.agent.settings import AgentSettings
from services.runtime import EventStore, Settings
from services.runtime.discovery import load_cluster_spec
from tests.integration.conftest import settings, stack, store

__all__ = ["settings", "stack", "store"]

# Allocates far more than the limit below, touching every page.
GREEDY = f"{shlex.quote(sys.executable)} -c 'b = bytearray(512 << 20)'"
LIMIT_BYTES = 48 << 20

# ---------------------------------------------------------------------- the rule


def test_sigkill_while_the_oom_kill_count_rises_is_out_of_memory() -> None:
    assert killed_for_memory(-9, 0, 1)  # the rank's own process was killed
    assert killed_for_memory(137, 4, 5)  # a shell or the sandbox reports its child's SIGKILL


def test_any_other_end_is_not_out_of_memory() -> None:
    assert not killed_for_memory(-9, 3, 3)  # someone sent SIGKILL; the kernel killed nothing
    assert not killed_for_memory(1, 0, 1)  # a crash, while something else ran out
    assert not killed_for_memory(-15, 0, 1)
    assert not killed_for_memory(0, 0, 1)
    assert not killed_for_memory(-9, None, 1)  # never counted: nothing to compare


def test_the_count_comes_from_the_ranks_memory_cgroup_where_it_has_one(tmp_path: Path) -> None:
    v2 = tmp_path / "v2" / "gangway" / "j-a1-r0"
    v2.mkdir(parents=True)
    (v2 / "memory.events").write_text("low 0\nhigh 0\nmax 12\noom 3\noom_kill 2\n")
    assert oom_kill_count("j-a1-r0", tmp_path / "v2") == 2
    v1 = tmp_path / "v1" / "memory" / "gangway" / "j-a1-r0"
    v1.mkdir(parents=True)
    (v1 / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 5\n")
    assert oom_kill_count("j-a1-r0", tmp_path / "v1") == 5


def test_without_a_memory_cgroup_the_count_is_the_hosts(tmp_path: Path) -> None:
    host = oom_kill_count(None)
    assert host >= 0
    # A rank whose cgroup has no memory controller (cgroup v1, pids only) counts the host's.
    (tmp_path / "pids" / "gangway" / "j-a1-r0").mkdir(parents=True)
    assert oom_kill_count("j-a1-r0", tmp_path) == host


# ---------------------------------------------------------------------- a real rank


@pytest.fixture
def memory_limit() -> Iterator[Path]:
    """A memory cgroup limited to LIMIT_BYTES; its cgroup.procs file, which a rank joins."""
    name = f"gangway-oom-test-{uuid.uuid4().hex[:8]}"
    if (CGROUP_ROOT / "cgroup.controllers").exists():
        group, limit_file = CGROUP_ROOT / name, "memory.max"
    else:
        group, limit_file = CGROUP_ROOT / "memory" / name, "memory.limit_in_bytes"
    try:
        group.mkdir()
        (group / limit_file).write_text(str(LIMIT_BYTES))
        with contextlib.suppress(OSError):
            (group / "memory.swap.max").write_text("0")
    except OSError as error:
        with contextlib.suppress(OSError):
            group.rmdir()
        pytest.skip(f"this kernel does not let the test limit a process's memory: {error}")
    yield group / "cgroup.procs"
    with contextlib.suppress(OSError):
        group.rmdir()


@pytest.fixture
async def agent(settings: Settings, store: EventStore, tmp_path: Path) -> AsyncIterator[Agent]:
    # Ranks of the agent's own user: they may move themselves into the test's memory cgroup.
    agent_settings = AgentSettings(
        **{
            **settings.model_dump(),
            "work_dir": tmp_path / "work",
            "checkpoint_root": tmp_path / "checkpoints",
            "fault_dir": tmp_path / "faults",
            "rank_isolation": "off",
        },
        _env_file=None,
    )
    running = Agent(agent_settings, store, load_cluster_spec("1x8"))
    yield running
    await running.shutdown()


async def run_rank(agent: Agent, store: EventStore, script: str) -> TaskExited:
    """Submit a one-rank job running `script` under sh, start it, return its recorded exit."""
    job = f"oom-{uuid.uuid4().hex[:8]}"
    spec = JobSpec(name="t", team="ml", gpus_per_task=8, command=["sh", "-c", script])
    gang = GangReserved(
        job_id=job, attempt=1, ranks=[RankPlacement(rank=0, node_id="n0000", gpus=list(range(8)))]
    )
    await store.append(f"job-{job}", None, [JobSubmitted(job_id=job, spec=spec, submitted_by="t")])
    [envelope] = await store.append(f"job-{job}", None, [gang])
    async with store.pool.acquire() as conn:
        await agent.handlers()[envelope.type](envelope, conn)
    await agent.launches_done()
    async with asyncio.timeout(60):
        while True:
            events = [e.payload for e in await store.read_stream(f"job-{job}")]
            exits = [e for e in events if isinstance(e, TaskExited)]
            if exits:
                return exits[0]
            await asyncio.sleep(0.05)


@pytest.mark.integration
async def test_a_rank_killed_by_the_oom_killer_is_recorded_as_out_of_memory(
    agent: Agent, store: EventStore, memory_limit: Path
) -> None:
    exited = await run_rank(agent, store, f"echo $$ > {memory_limit} && exec {GREEDY}")
    assert exited.exit_code == -int(signal.SIGKILL)
    assert exited.out_of_memory and exited.reason == OOM_REASON


@pytest.mark.integration
async def test_a_launcher_script_reporting_its_childs_oom_kill_is_out_of_memory(
    agent: Agent, store: EventStore, memory_limit: Path
) -> None:
    exited = await run_rank(agent, store, f"echo $$ > {memory_limit} && {GREEDY}; exit $?")
    assert exited.exit_code == 137
    assert exited.out_of_memory and exited.reason == OOM_REASON


@pytest.mark.integration
async def test_a_rank_killed_by_a_person_is_not_out_of_memory(
    agent: Agent, store: EventStore
) -> None:
    exited = await run_rank(agent, store, "kill -9 $$")
    assert exited.exit_code == -int(signal.SIGKILL)
    assert not exited.out_of_memory and exited.reason is None
