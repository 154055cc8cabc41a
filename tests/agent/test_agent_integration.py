"""The agent against the real log: each rank starts once, its exit and eviction are recorded."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from schemas.base import Event
from schemas.checkpoints import CheckpointCommitted, CheckpointCorrupted, CheckpointRequested
from schemas.envelope import EventEnvelope
from schemas.jobs import (
    GangReserved,
    JobCancelled,
    JobSpec,
    JobSubmitted,
    PreemptionRequested,
    RankPlacement,
    TaskExited,
    TaskStarted,
)
from services.agent import isolation
from services.agent.agent import Agent
from services.agent.settings import AgentSettings
from services.runtime import EventStore, Settings
from services.runtime.checkpoint_store import (
    checkpoint_dir,
    checkpoint_id_for,
    shard_path,
    verify,
    write_shard,
)
from services.runtime.discovery import load_cluster_spec
from services.runtime.errors import DomainError
from tests.integration.conftest import settings, stack, store

pytestmark = pytest.mark.integration
__all__ = ["settings", "stack", "store"]

NODES = load_cluster_spec("2x8")  # n0000, n0001
JOB = "j1"


@pytest.fixture
async def agent(settings: Settings, store: EventStore, tmp_path: Path) -> AsyncIterator[Agent]:
    running = make_agent(settings, store, tmp_path)
    yield running
    await running.shutdown()


def make_agent(settings: Settings, store: EventStore, tmp_path: Path, **extra: Any) -> Agent:
    agent_settings = AgentSettings(
        **{
            **settings.model_dump(),
            "work_dir": tmp_path / "work",
            "checkpoint_root": tmp_path / "checkpoints",
            "fault_dir": tmp_path / "faults",
            "stop_timeout_s": 2.0,
            **extra,
        },
        _env_file=None,
    )
    return Agent(agent_settings, store, NODES)


async def reserve(store: EventStore, command: list[str], nodes: list[str]) -> EventEnvelope:
    spec = JobSpec(name="t", team="ml", tasks=len(nodes), gpus_per_task=8, command=command)
    gang = GangReserved(
        job_id=JOB,
        attempt=1,
        ranks=[RankPlacement(rank=r, node_id=n, gpus=list(range(8))) for r, n in enumerate(nodes)],
    )
    await store.append(f"job-{JOB}", None, [JobSubmitted(job_id=JOB, spec=spec, submitted_by="t")])
    [envelope] = await store.append(f"job-{JOB}", None, [gang])
    return envelope


async def job_events(store: EventStore) -> list[Event]:
    return [envelope.payload for envelope in await store.read_stream(f"job-{JOB}")]


async def handle(agent: Agent, envelope: EventEnvelope) -> None:
    handler = agent.handlers()[envelope.type]
    async with agent.store.pool.acquire() as conn:
        await handler(envelope, conn)
    await agent.launches_done()


async def until(probe: Callable[[], Awaitable[object]], what: str) -> None:
    try:
        async with asyncio.timeout(30):
            while True:
                if await probe():
                    return
                await asyncio.sleep(0.05)
    except TimeoutError:
        raise AssertionError(f"never happened: {what}") from None


async def test_a_redelivered_reservation_starts_each_rank_once(
    agent: Agent, store: EventStore, settings: Settings, tmp_path: Path
) -> None:
    envelope = await reserve(store, ["sleep", "600"], ["n0000", "n0001"])
    await handle(agent, envelope)
    await handle(agent, envelope)
    # A restarted agent knows nothing in memory; the log tells it the ranks already started.
    await handle(make_agent(settings, store, tmp_path), envelope)
    started = [e for e in await job_events(store) if isinstance(e, TaskStarted)]
    assert sorted((e.rank, e.node_id) for e in started) == [(0, "n0000"), (1, "n0001")]
    assert len([r for r in agent.ranks.values() if r.running]) == 2


async def test_ranks_on_other_nodes_are_not_this_agents(agent: Agent, store: EventStore) -> None:
    await handle(agent, await reserve(store, ["sleep", "600"], ["n0009", "n0010"]))
    assert not any(isinstance(e, TaskStarted) for e in await job_events(store))


async def test_a_rank_exit_is_recorded_with_its_code(agent: Agent, store: EventStore) -> None:
    await handle(agent, await reserve(store, ["sh", "-c", "exit 7"], ["n0000"]))

    async def exited() -> list[TaskExited]:
        return [e for e in await job_events(store) if isinstance(e, TaskExited)]

    await until(exited, "the exit recorded")
    [event] = await exited()
    assert (event.rank, event.exit_code, event.reason) == (0, 7, None)


async def test_an_env_that_cannot_launch_ends_the_attempt_with_a_permanent_reason(
    agent: Agent, store: EventStore
) -> None:
    spec = JobSpec(name="t", team="ml", gpus_per_task=8, command=["true"], env={"A=B": "c"})
    gang = GangReserved(
        job_id=JOB, attempt=1, ranks=[RankPlacement(rank=0, node_id="n0001", gpus=list(range(8)))]
    )
    await store.append(f"job-{JOB}", None, [JobSubmitted(job_id=JOB, spec=spec, submitted_by="t")])
    [envelope] = await store.append(f"job-{JOB}", None, [gang])
    await handle(agent, envelope)
    events = await job_events(store)
    assert [e.type for e in events[-2:]] == ["TaskStarted", "TaskExited"]
    exited = events[-1]
    assert isinstance(exited, TaskExited)
    assert exited.reason == "launch failed on n0001 rank 0: illegal environment variable name 'A=B'"
    assert exited.permanent


async def test_a_missing_program_is_recorded_as_a_failed_launch(
    agent: Agent, store: EventStore
) -> None:
    await handle(agent, await reserve(store, ["/nonexistent/train"], ["n0000"]))
    events = await job_events(store)
    assert [e.type for e in events[-2:]] == ["TaskStarted", "TaskExited"]
    exited = events[-1]
    assert isinstance(exited, TaskExited) and exited.exit_code == 127
    assert exited.permanent
    assert exited.reason == "launch failed on n0000 rank 0: no such program: /nonexistent/train"


async def test_a_preempted_gang_leaves_a_verified_shard_per_rank_and_stops(
    agent: Agent, store: EventStore, tmp_path: Path
) -> None:
    await handle(agent, await reserve(store, ["sleep", "600"], ["n0000", "n0001"]))
    preempt = PreemptionRequested(
        job_id=JOB, attempt=1, preemptor_job_id="other", reason="test", grace_s=3
    )
    [envelope] = await store.append(f"job-{JOB}", None, [preempt])
    await handle(agent, envelope)

    async def both_exited() -> bool:
        exits = [e for e in await job_events(store) if isinstance(e, TaskExited)]
        return len(exits) == 2 and all(e.reason == "preempted" for e in exits)

    await until(both_exited, "both ranks evicted")
    directory = checkpoint_dir(
        tmp_path / "checkpoints", JOB, checkpoint_id_for(1, envelope.event_id)
    )
    assert verify(directory, 2).ok


async def test_a_restarted_agent_stops_and_records_the_ranks_it_was_left(
    agent: Agent, store: EventStore, settings: Settings, tmp_path: Path
) -> None:
    await handle(agent, await reserve(store, ["sleep", "600"], ["n0000", "n0001"]))
    orphans = [rank.process for rank in agent.ranks.values()]
    # The first agent "crashes": its ranks run on, unwatched, and a new agent starts.
    successor = make_agent(settings, store, tmp_path)
    assert await successor.reconcile() == 2
    assert [await asyncio.wait_for(p.wait(), 30) for p in orphans] == [-9, -9]
    recorded = {
        e.rank
        for e in await job_events(store)
        if isinstance(e, TaskExited) and e.reason == "agent restarted: rank stopped"
    }
    assert recorded == {0, 1}
    assert await successor.reconcile() == 0


async def test_a_gang_of_a_job_never_submitted_is_refused(agent: Agent, store: EventStore) -> None:
    gang = GangReserved(
        job_id="ghost", attempt=1, ranks=[RankPlacement(rank=0, node_id="n0000", gpus=[0])]
    )
    [envelope] = await store.append("job-ghost", None, [gang])
    with pytest.raises(DomainError, match="no JobSubmitted"):
        await handle(agent, envelope)
    assert agent.ranks == {}


def committed(root: Path, checkpoint_id: str, data: bytes) -> CheckpointCommitted:
    directory = checkpoint_dir(root, JOB, checkpoint_id)
    write_shard(directory, 0, data, step=1)
    verification = verify(directory, 1)
    return CheckpointCommitted(
        job_id=JOB, attempt=1, checkpoint_id=checkpoint_id, step=1, shards=verification.shards
    )


async def test_a_checkpoint_damaged_after_its_commit_is_not_resumed_from(
    agent: Agent, store: EventStore, tmp_path: Path
) -> None:
    root = tmp_path / "checkpoints"
    good = committed(root, "a1-good", b"step 100")
    bad = committed(root, "a1-newer", b"step 200")
    await store.append(f"checkpoint-{JOB}", None, [good, bad])
    # Same size, different bytes: only the hash can tell.
    shard_path(checkpoint_dir(root, JOB, "a1-newer"), 0).write_bytes(b"step 2X0")

    script = 'echo "$GANGWAY_CHECKPOINT_DIR" > resumed-from'
    await handle(agent, await reserve(store, ["sh", "-c", script], ["n0000"]))

    resumed = tmp_path / "work" / JOB / "a1" / "rank-0" / "resumed-from"

    async def written() -> bool:
        return resumed.is_file() and resumed.read_text().strip() != ""

    await until(written, "the rank says where it resumed from")
    assert resumed.read_text().strip() == str(checkpoint_dir(root.resolve(), JOB, "a1-good"))
    verdicts = [e.payload for e in await store.read_stream(f"checkpoint-{JOB}")]
    corrupted = [e for e in verdicts if isinstance(e, CheckpointCorrupted)]
    assert [e.checkpoint_id for e in corrupted] == ["a1-newer"]
    assert "sha256" in corrupted[0].reason


async def test_a_rank_that_checkpoints_itself_finds_its_directory_when_signalled(
    agent: Agent, store: EventStore, tmp_path: Path
) -> None:
    # The handler writes straight into the checkpoint directory, as a natural one would.
    script = (
        'trap \'d=$(sed -e "s/.*\\"dir\\": \\"\\([^\\"]*\\)\\".*/\\1/" '
        '$GANGWAY_CHECKPOINT_REQUEST); printf state > "$d/rank-0.bin.tmp" && '
        'mv "$d/rank-0.bin.tmp" "$d/rank-0.bin"\' USR1; '
        "while true; do sleep 0.1; done"
    )
    spec = JobSpec(
        name="t",
        team="ml",
        gpus_per_task=8,
        command=["sh", "-c", script],
        env={"GANGWAY_CHECKPOINT_SIGNAL": "1"},
    )
    gang = GangReserved(
        job_id=JOB, attempt=1, ranks=[RankPlacement(rank=0, node_id="n0000", gpus=list(range(8)))]
    )
    await store.append(f"job-{JOB}", None, [JobSubmitted(job_id=JOB, spec=spec, submitted_by="t")])
    [envelope] = await store.append(f"job-{JOB}", None, [gang])
    await handle(agent, envelope)
    request = CheckpointRequested(job_id=JOB, attempt=1, reason="test")
    [asked] = await store.append(f"checkpoint-{JOB}", None, [request])
    await handle(agent, asked)
    directory = checkpoint_dir(tmp_path / "checkpoints", JOB, checkpoint_id_for(1, asked.event_id))

    async def recorded() -> bool:
        return (directory / "rank-0.json").is_file()

    await until(recorded, "the rank's own shard is recorded")
    assert verify(directory, 1).ok


def _alive(pid: int) -> bool:
    """Whether `pid` still runs (a zombie waiting for its reaper holds no GPU)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


async def exit_recorded(store: EventStore) -> None:
    async def exited() -> bool:
        return any(isinstance(e, TaskExited) for e in await job_events(store))

    await until(exited, "the exit recorded")


async def worker_after_exit(
    agent: Agent, store: EventStore, tmp_path: Path, command: list[str]
) -> int:
    """The pid a rank running `command` wrote to worker.pid, once its exit is recorded."""
    await handle(agent, await reserve(store, command, ["n0000"]))
    await exit_recorded(store)
    return int((tmp_path / "work" / JOB / "a1" / "rank-0" / "worker.pid").read_text())


def unsandboxed_agent(settings: Settings, store: EventStore, tmp_path: Path) -> Agent:
    """An agent on a host where bubblewrap does not work: no PID namespace ends a rank's
    processes with it, so what its leader leaves behind is the agent's to stop."""
    return make_agent(settings, store, tmp_path, rank_sandbox="none")


async def test_a_rank_whose_leader_exits_leaves_no_process_on_its_gpus(
    settings: Settings, store: EventStore, tmp_path: Path
) -> None:
    # attack6: a launcher script that starts its worker in the background and exits 0 (or
    # any rank whose child outlives it) left that child running with CUDA_VISIBLE_DEVICES on
    # GPUs the recorded exit handed back to the scheduler, which bound them to the next gang:
    # two jobs on one GPU. The exit is recorded only once no process of the rank is left.
    agent = unsandboxed_agent(settings, store, tmp_path)
    try:
        command = ["sh", "-c", "sleep 600 & echo $! > worker.pid; exit 0"]
        assert not _alive(await worker_after_exit(agent, store, tmp_path, command))
    finally:
        await agent.shutdown()


async def test_a_stopped_rank_leaves_no_process_that_ignored_the_sigterm(
    settings: Settings, store: EventStore, tmp_path: Path
) -> None:
    # attack6: a cancelled rank's leader died of the SIGTERM while a child ignoring it ran on;
    # the leader's exit ended the wait, so the SIGKILL after the stop timeout never came.
    agent = unsandboxed_agent(settings, store, tmp_path)
    try:
        command = ["sh", "-c", "(trap '' TERM; exec sleep 600) & echo $! > worker.pid; wait"]
        await handle(agent, await reserve(store, command, ["n0000"]))
        pid_file = tmp_path / "work" / JOB / "a1" / "rank-0" / "worker.pid"

        async def worker_started() -> bool:
            return pid_file.exists() and pid_file.read_text().strip() != ""

        await until(worker_started, "the worker started")
        [envelope] = await store.append(
            f"job-{JOB}", None, [JobCancelled(job_id=JOB, attempt=1, reason="test")]
        )
        await handle(agent, envelope)

        await exit_recorded(store)
        assert not _alive(int(pid_file.read_text()))
    finally:
        await agent.shutdown()


@pytest.mark.skipif(
    os.geteuid() != 0 or isolation.cgroup_version() is None,
    reason="ranks get cgroups of their own only from an agent that is root, on a host with them",
)
async def test_a_process_that_left_its_ranks_group_is_stopped_through_its_cgroup(
    settings: Settings, store: EventStore, tmp_path: Path
) -> None:
    # attack6: without bubblewrap, `setsid` after a fork leaves the rank's process group and
    # its tree; it cannot leave the cgroup the agent put the rank in.
    agent = unsandboxed_agent(settings, store, tmp_path)
    try:
        command = ["sh", "-c", "setsid sh -c 'sleep 600 & echo $! > worker.pid'; exit 0"]
        assert not _alive(await worker_after_exit(agent, store, tmp_path, command))
    finally:
        await agent.shutdown()


@pytest.mark.skipif(
    os.geteuid() != 0 or isolation.cgroup_version() is None,
    reason="ranks get cgroups of their own only from an agent that is root, on a host with them",
)
async def test_a_restarted_agent_stops_a_rank_that_removed_its_pid_file(
    settings: Settings, store: EventStore, tmp_path: Path
) -> None:
    # attack6: rank.pid lies in the directory the rank owns; a rank that removed it (or wrote
    # another of its processes' pids there) was recorded as ended by the restarted agent
    # ("rank lost") and ran on, unsandboxed, on GPUs the scheduler then gave to another gang.
    agent = unsandboxed_agent(settings, store, tmp_path)
    wait = "while [ ! -s rank.pid ]; do sleep 0.05; done"  # written once the rank started
    command = ["sh", "-c", f"{wait}; rm rank.pid; echo $$ > own.pid; exec sleep 600"]
    await handle(agent, await reserve(store, command, ["n0000"]))
    pid_file = tmp_path / "work" / JOB / "a1" / "rank-0" / "own.pid"

    async def pid_file_gone() -> bool:
        return pid_file.exists() and not (pid_file.parent / "rank.pid").exists()

    await until(pid_file_gone, "the rank removed its pid file")
    rank = int(pid_file.read_text())
    # The agent "crashes" (its ranks run on, unwatched) and a new one starts.
    assert await unsandboxed_agent(settings, store, tmp_path).reconcile() == 1
    try:
        assert not _alive(rank)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(rank, signal.SIGKILL)
        await agent.shutdown()
