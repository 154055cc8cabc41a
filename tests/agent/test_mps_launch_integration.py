"""A real node's MPS shares each reach their own GPU's MPS control daemon, which the agent
runs (services/agent/mps.py), against a stand-in control program (tests/agent/mps_standin.py).

The defect: the agent gave every MPS share the pipe directory of the host's one daemon (the
operator's), which runs one user's MPS server at a time. Ranks run as their team's user, so
team B's share on GPU 2 hung in CUDA's initialisation for as long as team A's share ran on
GPU 1 (on a real H100 a second user's client waited 25.9 s for the first's server to exit)."""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from schemas.jobs import (
    GangReserved,
    GpuShare,
    JobCancelled,
    JobSpec,
    JobSubmitted,
    RankPlacement,
    TaskExited,
    TaskStarted,
)
from schemas.nodes import GpuInfo, NodeRegistered
from services.agent import isolation
from services.agent.agent import Agent
from services.agent.settings import AgentSettings
from services.runtime import EventStore, Settings
from tests.agent import mps_standin
from tests.agent.test_agent_integration import NODES, until
from tests.agent.test_agent_launch_integration import deliver, events_of
from tests.integration.conftest import settings, stack, store

pytestmark = pytest.mark.integration
__all__ = ["settings", "stack", "store"]

UUIDS = [f"GPU-0000000{i}-1111-2222-3333-444444444444" for i in range(3)]
# Each GPU's daemon directory: its UUID's first 8 hex digits (services/agent/mps.py `_name`).
DIRECTORIES = [f"0000000{i}" for i in range(3)]
NODE = NodeRegistered(
    node_id="gpu-host",
    hostname="gpu-host",
    gpu_type="H100",
    gpus=[
        GpuInfo(index=i, uuid=uuid, model="H100", memory_mb=81_559) for i, uuid in enumerate(UUIDS)
    ],
    rack="r0",
    block="b0",
    discovered_by="nvml",
)
SHOW = 'echo "gpu=$CUDA_VISIBLE_DEVICES pipe=${CUDA_MPS_PIPE_DIRECTORY-none}"'

needs_sandbox = pytest.mark.skipif(
    os.geteuid() != 0 or not isolation.bwrap_works(),
    reason="the sandbox needs root and a working bubblewrap",
)


@pytest.fixture
def record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    path = mps_standin.install(tmp_path, monkeypatch)
    yield path
    mps_standin.kill_left(path)


MakeAgent = Callable[..., Agent]


@pytest.fixture
async def real_agent(
    settings: Settings, store: EventStore, tmp_path: Path, record: Path
) -> AsyncIterator[MakeAgent]:
    """An agent of a real node of three GPUs (no driver: sampler-less), made with `extra`
    settings; ranks unsandboxed unless told (this host has no /proc/driver/nvidia). Stopped
    before the stand-in's daemons are (`record`)."""
    made: list[Agent] = []

    def make(**extra: Any) -> Agent:
        agent_settings = AgentSettings(
            **{
                **settings.model_dump(),
                "work_dir": tmp_path / "work",
                "checkpoint_root": tmp_path / "checkpoints",
                "fault_dir": tmp_path / "faults",
                "stop_timeout_s": 2.0,
                "rank_isolation": "off",
                **extra,
            },
            _env_file=None,
        )
        agent = Agent(agent_settings, store, [NODE])
        made.append(agent)
        return agent

    yield make
    for agent in made:
        await agent.shutdown()


async def submit(
    store: EventStore, job_id: str, team: str, gpu: int, command: str, *, share: bool = True
) -> GangReserved:
    """A one-rank job on GPU `gpu` of the node: an MPS share of it, or the whole GPU."""
    fraction = {"gpu_fraction": 0.25} if share else {"gpus_per_task": 1}
    spec = JobSpec.model_validate(
        {"name": "t", "team": team, "tasks": 1, "command": ["sh", "-c", command], **fraction}
    )
    await store.append(
        f"job-{job_id}", None, [JobSubmitted(job_id=job_id, spec=spec, submitted_by="t")]
    )
    placement = RankPlacement(
        rank=0,
        node_id="gpu-host",
        gpus=[gpu],
        share=GpuShare(thousandths=250, sharing="mps") if share else None,
    )
    return GangReserved(job_id=job_id, attempt=1, ranks=[placement])


def rank_log(tmp_path: Path, job_id: str) -> Path:
    return tmp_path / "work" / job_id / "a1" / "rank-0" / "rank.log"


async def said(tmp_path: Path, job_id: str, lines: int) -> list[str]:
    """The rank's first `lines` lines of output, once it has printed them."""
    log = rank_log(tmp_path, job_id)

    async def printed() -> bool:
        return log.exists() and len(log.read_text().splitlines()) >= lines

    await until(printed, f"{job_id} printed {lines} lines")
    return log.read_text().splitlines()[:lines]


async def ended(store: EventStore, job_id: str) -> TaskExited:
    async def exited() -> list[TaskExited]:
        return await events_of(store, job_id, TaskExited)

    await until(exited, f"{job_id}'s exit recorded")
    [exit] = await exited()
    return exit


async def until_quit(record: Path, pid: int) -> None:
    async def quit() -> bool:
        return pid not in mps_standin.live(record)

    await until(quit, f"the stand-in daemon {pid} quit")


def gpus_of(record: Path) -> dict[str, int]:
    """The live stand-in daemons by the GPU each was started for."""
    return {
        start["env"]["CUDA_VISIBLE_DEVICES"]: pid for pid, start in mps_standin.live(record).items()
    }


@needs_sandbox
async def test_two_teams_shares_on_two_gpus_each_reach_only_their_own_gpu_s_daemon(
    real_agent: MakeAgent,
    store: EventStore,
    tmp_path: Path,
    record: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Sandboxed as on a real node: each share sees its own GPU's pipe directory (and its
    daemon's control pipe) under the daemons' root and no other GPU's; a whole-GPU rank sees
    the root empty and is given no pipe directory."""
    # This host has no GPU device nodes to give the sandbox.
    monkeypatch.setattr(isolation, "gpu_device_nodes", lambda uuids, mig=None: [])
    agent = real_agent(rank_isolation="on", rank_sandbox="bwrap")
    assert agent.mps is not None
    root = agent.mps.root
    show = f"{SHOW}; find {root} | sort; exec sleep 600"
    await deliver(agent, store, "a", await submit(store, "a", "vision", 1, show))
    await deliver(agent, store, "b", await submit(store, "b", "audio", 2, show))
    await deliver(agent, store, "w", await submit(store, "w", "nlp", 0, show, share=False))
    pipe_a, pipe_b = root / DIRECTORIES[1] / "pipe", root / DIRECTORIES[2] / "pipe"
    assert await said(tmp_path, "a", 5) == [
        f"gpu={UUIDS[1]} pipe={pipe_a}",
        str(root),
        str(root / DIRECTORIES[1]),
        str(pipe_a),
        str(pipe_a / "control"),
    ]
    assert await said(tmp_path, "b", 5) == [
        f"gpu={UUIDS[2]} pipe={pipe_b}",
        str(root),
        str(root / DIRECTORIES[2]),
        str(pipe_b),
        str(pipe_b / "control"),
    ]
    assert await said(tmp_path, "w", 2) == [f"gpu={UUIDS[0]} pipe=none", str(root)]
    assert rank_log(tmp_path, "w").read_text().splitlines() == [
        f"gpu={UUIDS[0]} pipe=none",
        str(root),
    ]
    # Two daemons, each on its own GPU, listening where its share looks; none for GPU 0.
    starts = {
        start["env"]["CUDA_VISIBLE_DEVICES"]: start["env"]
        for start in mps_standin.live(record).values()
    }
    assert starts == {
        UUIDS[1]: {
            "CUDA_VISIBLE_DEVICES": UUIDS[1],
            "CUDA_MPS_PIPE_DIRECTORY": str(pipe_a),
            "CUDA_MPS_LOG_DIRECTORY": str(root / DIRECTORIES[1] / "log"),
        },
        UUIDS[2]: {
            "CUDA_VISIBLE_DEVICES": UUIDS[2],
            "CUDA_MPS_PIPE_DIRECTORY": str(pipe_b),
            "CUDA_MPS_LOG_DIRECTORY": str(root / DIRECTORIES[2] / "log"),
        },
    }
    # Each GPU's pipes are its team's user's alone: no other team's rank can even enter.
    assert pipe_a.stat().st_uid == isolation.team_user("vision").uid
    assert pipe_b.stat().st_uid == isolation.team_user("audio").uid
    # The agent's stop quits every daemon it started.
    daemons = list(mps_standin.live(record))
    await agent.shutdown()
    for pid in daemons:
        await until_quit(record, pid)
    assert not pipe_a.exists() and not pipe_b.exists()


async def test_a_gpu_s_daemon_is_quit_once_its_last_share_has_ended_and_not_before(
    real_agent: MakeAgent, store: EventStore, tmp_path: Path, record: Path
) -> None:
    agent = real_agent()
    show = f"{SHOW}; exec sleep 600"
    await deliver(agent, store, "one", await submit(store, "one", "vision", 1, show))
    await deliver(agent, store, "two", await submit(store, "two", "vision", 1, show))
    pipe = tmp_path / "mps" / DIRECTORIES[1] / "pipe"
    # Unsandboxed, each still looks where its GPU's daemon listens.
    expected = [f"gpu={UUIDS[1]} pipe={pipe}"]
    assert await said(tmp_path, "one", 1) == expected
    assert await said(tmp_path, "two", 1) == expected
    [pid] = mps_standin.live(record)  # one daemon for the GPU's two shares
    await deliver(agent, store, "one", JobCancelled(job_id="one", attempt=1, reason="user"))
    await ended(store, "one")
    assert list(mps_standin.live(record)) == [pid]
    assert (pipe / "control").exists()
    await deliver(agent, store, "two", JobCancelled(job_id="two", attempt=1, reason="user"))
    await ended(store, "two")
    await until_quit(record, pid)
    assert not pipe.exists()


async def test_a_daemon_left_over_by_a_crashed_agent_is_quit_and_started_afresh(
    real_agent: MakeAgent, store: EventStore, tmp_path: Path, record: Path
) -> None:
    pipe = tmp_path / "mps" / DIRECTORIES[1] / "pipe"
    pipe.mkdir(parents=True)
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": UUIDS[1], "CUDA_MPS_PIPE_DIRECTORY": str(pipe)}
    await asyncio.to_thread(
        subprocess.run, ["nvidia-cuda-mps-control", "-d"], env=env, check=True, timeout=30
    )

    async def up() -> bool:
        return bool(mps_standin.live(record)) and (pipe / "control").exists()

    await until(up, "the leftover daemon up")
    [leftover] = mps_standin.live(record)
    agent = real_agent()
    show = f"{SHOW}; exec sleep 600"
    await deliver(agent, store, "s", await submit(store, "s", "vision", 1, show))
    assert await said(tmp_path, "s", 1) == [f"gpu={UUIDS[1]} pipe={pipe}"]
    await until_quit(record, leftover)
    [fresh] = mps_standin.live(record)
    assert fresh != leftover
    assert (pipe / "control").exists()


async def test_a_daemon_that_does_not_start_fails_the_share_s_launch_with_its_reason(
    real_agent: MakeAgent, store: EventStore, tmp_path: Path, record: Path
) -> None:
    await asyncio.to_thread(Path(f"{record}.fail").touch)
    agent = real_agent()
    await deliver(agent, store, "f", await submit(store, "f", "vision", 1, f"{SHOW}; sleep 600"))
    await agent.launches_done()
    failure = await ended(store, "f")
    reason = failure.reason or ""
    assert f"GPU {UUIDS[1]}'s MPS control daemon" in reason, reason
    assert "no such GPU" in reason, reason  # what the control program said
    assert not failure.permanent  # the next attempt, or another GPU, may do
    assert await events_of(store, "f", TaskStarted)  # recorded with its exit, as any launch
    assert not rank_log(tmp_path, "f").exists() or not rank_log(tmp_path, "f").read_text()
    assert mps_standin.live(record) == {}
    assert agent.mps is not None and agent.mps.running() == []


async def test_host_mode_gives_shares_the_operator_s_daemon_as_before(
    real_agent: MakeAgent, store: EventStore, tmp_path: Path, record: Path
) -> None:
    agent = real_agent(mps_daemon="host")
    assert agent.mps is None
    await deliver(agent, store, "h", await submit(store, "h", "vision", 1, f"{SHOW}; sleep 600"))
    # Unsandboxed, the rank looks where CUDA looks by default, as before: no daemon started.
    assert await said(tmp_path, "h", 1) == [f"gpu={UUIDS[1]} pipe=none"]
    assert mps_standin.events(record) == []
    assert not (tmp_path / "mps").exists()


async def test_a_simulated_node_starts_no_daemon(
    settings: Settings, store: EventStore, tmp_path: Path, record: Path
) -> None:
    agent_settings = AgentSettings(
        **{**settings.model_dump(), "work_dir": tmp_path / "work", "mps_daemon": "per-gpu"},
        _env_file=None,
    )
    assert Agent(agent_settings, store, NODES).mps is None


async def test_a_restarted_agent_quits_the_daemons_its_predecessor_left(
    real_agent: MakeAgent, store: EventStore, tmp_path: Path, record: Path
) -> None:
    """Its reconcile, once the predecessor's ranks are stopped: a GPU that never hosts
    another share does not keep a daemon nobody quits."""
    crashed = real_agent()
    show = f"{SHOW}; exec sleep 600"
    await deliver(crashed, store, "s", await submit(store, "s", "vision", 2, show))
    await said(tmp_path, "s", 1)
    [leftover] = mps_standin.live(record)
    crashed.mps = None  # it dies: nothing of it quits its daemons
    successor = real_agent()
    await successor.reconcile()
    await until_quit(record, leftover)
    assert mps_standin.live(record) == {}
    assert not (tmp_path / "mps" / DIRECTORIES[2] / "pipe").exists()


async def daemon_starting(record: Path) -> int:
    """The pid of the one stand-in daemon, once it has recorded its start."""

    async def started() -> bool:
        return len(mps_standin.live(record)) == 1

    await until(started, "a stand-in daemon started")
    [pid] = mps_standin.live(record)
    return pid


async def test_a_share_cancelled_while_its_gpu_s_daemon_starts_leaves_no_daemon(
    real_agent: MakeAgent, store: EventStore, tmp_path: Path, record: Path
) -> None:
    """The launch goes on to the daemon's start (`hold`: still starting when the cancel
    comes); the share's rank is then stopped, and the daemon quit with it."""
    hold = Path(f"{record}.hold")
    await asyncio.to_thread(hold.touch)
    agent = real_agent()
    show = f"{SHOW}; exec sleep 600"
    await deliver(agent, store, "c", await submit(store, "c", "vision", 1, show))
    pid = await daemon_starting(record)
    await deliver(agent, store, "c", JobCancelled(job_id="c", attempt=1, reason="user"))
    await asyncio.to_thread(hold.unlink)
    await agent.launches_done()
    await ended(store, "c")
    await until_quit(record, pid)
    assert agent.mps is not None and agent.mps.running() == []
    assert not (tmp_path / "mps" / DIRECTORIES[1] / "pipe").exists()


async def test_an_agent_stopped_while_a_gpu_s_daemon_starts_leaves_no_daemon(
    real_agent: MakeAgent, store: EventStore, tmp_path: Path, record: Path
) -> None:
    hold = Path(f"{record}.hold")
    await asyncio.to_thread(hold.touch)
    agent = real_agent()
    show = f"{SHOW}; exec sleep 600"
    await deliver(agent, store, "s", await submit(store, "s", "vision", 1, show))
    pid = await daemon_starting(record)
    stopping = asyncio.create_task(agent.shutdown())
    await asyncio.to_thread(hold.unlink)
    await stopping
    await until_quit(record, pid)
    assert agent.mps is not None and agent.mps.running() == []
    assert not (tmp_path / "mps" / DIRECTORIES[1] / "pipe").exists()
