"""On a host with NVIDIA GPUs: discovery, heartbeats and a sandboxed rank against the real
driver, read-only (nothing here changes MIG mode, clocks or any setting).

Skipped where no driver loads (CI, the simulated fleet); run on a GPU host as root with
`python -m pytest tests/gpu`. Each check here once failed on a real H100 while passing against
the stand-in drivers of tests/inventory and tests/agent: discovery crashed on NVML's C-style
placement call, and a sandboxed rank saw no GPU at all."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from core.mig import mig_model
from schemas.jobs import GpuShare, JobSpec, RankPlacement
from services.agent import isolation
from services.agent.devices import device_env, mps_share
from services.agent.heartbeats import NvmlSampler
from services.agent.mps import MPS_CONTROL, MpsDaemons
from services.agent.ranks import RankKey, launch
from services.health.rules import HealthMonitor
from services.runtime.discovery import discover, gpu_type_of, import_nvml
from services.runtime.mig_discovery import read_mig
from tests.inventory.test_mig_discovery import core_table, read_table


def _driver() -> Any:
    nvml = import_nvml()
    if nvml is None:
        return None
    try:
        nvml.nvmlInit()
    except Exception:  # no driver loaded: the simulated fleet's hosts
        return None
    if int(nvml.nvmlDeviceGetCount()) == 0:
        return None
    return nvml


NVML = _driver()
pytestmark = pytest.mark.skipif(NVML is None, reason="no NVIDIA driver or GPU on this host")


def _cuda_python() -> bool:
    """Whether this interpreter's torch can run CUDA work (the load and the rank need it)."""
    probe = "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"
    return subprocess.run([sys.executable, "-c", probe], check=False).returncode == 0


needs_cuda = pytest.mark.skipif(NVML is None or not _cuda_python(), reason="no CUDA torch")


def _uuid(index: int) -> str:
    value = NVML.nvmlDeviceGetUUID(NVML.nvmlDeviceGetHandleByIndex(index))
    return value.decode() if isinstance(value, bytes) else str(value)


def _gpu_pids(index: int) -> set[int]:
    handle = NVML.nvmlDeviceGetHandleByIndex(index)
    return {int(p.pid) for p in NVML.nvmlDeviceGetComputeRunningProcesses(handle)}


def test_discovery_registers_this_host_as_the_driver_sees_it() -> None:
    (node,) = discover("", mode="nvml")
    count = int(NVML.nvmlDeviceGetCount())
    assert node.discovered_by == "nvml"
    assert [g.index for g in node.gpus] == list(range(count))
    assert [g.uuid for g in node.gpus] == [_uuid(i) for i in range(count)]
    name = NVML.nvmlDeviceGetName(NVML.nvmlDeviceGetHandleByIndex(0))
    model = name.decode() if isinstance(name, bytes) else str(name)
    assert node.gpu_type == gpu_type_of(model)
    assert all(g.memory_mb > 1024 for g in node.gpus)
    assert node.cpus == os.cpu_count()


def test_the_mig_profile_table_the_driver_reports_is_the_core_s() -> None:
    handle = NVML.nvmlDeviceGetHandleByIndex(0)
    name = NVML.nvmlDeviceGetName(handle)
    table = mig_model(name.decode() if isinstance(name, bytes) else str(name))
    gpu = read_mig(NVML, handle, 0)
    if table is None or not gpu.capable:
        pytest.skip("this GPU has no MIG table in core/mig.py")
    assert read_table(gpu) == core_table(table)


@pytest.fixture
def busy_gpu() -> Iterator[subprocess.Popen[bytes]]:
    """GPU 0 multiplying matrices for a while, in a process of its own."""
    program = textwrap.dedent(
        """
        import time, torch
        x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
        end = time.monotonic() + 30
        while time.monotonic() < end:
            y = x @ x
            torch.cuda.synchronize()
        """
    )
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": _uuid(0)}
    process = subprocess.Popen([sys.executable, "-c", program], env=env)
    yield process
    process.kill()
    process.wait()


@needs_cuda
def test_heartbeats_see_a_busy_gpu_its_memory_and_its_sm_activity(
    busy_gpu: subprocess.Popen[bytes],
) -> None:
    sampler = NvmlSampler(NVML)
    samples = []
    for _ in range(8):
        time.sleep(1.0)
        samples.append(sampler.heartbeat("gpu-host", datetime.now(UTC)).gpus[0])
    busy = [s for s in samples if s.utilization is not None and s.utilization > 50]
    assert busy, [s.model_dump() for s in samples]
    assert max(s.memory_used_mb or 0 for s in busy) > 256  # the matrices are on the GPU
    assert all(s.temperature_c is not None and 0 < s.temperature_c < 110 for s in samples)
    assert all(s.xid_errors == [] for s in samples)
    if sampler.gpm.handles:  # Hopper and later: SM activity between two heartbeats
        assert max(s.sm_activity or 0.0 for s in busy) > 10.0
    assert busy_gpu.pid in _gpu_pids(0)
    # A busy, healthy GPU is nothing for health to record (no false drain under load).
    monitor = HealthMonitor()
    assert [monitor.observe_heartbeat(sampler.heartbeat("gpu-host", datetime.now(UTC)))] == [[]]


RANK_PROGRAM = textwrap.dedent(
    """
    import os, time, torch
    x = torch.ones(1024, 1024, device="cuda")
    print("gpus", torch.cuda.device_count(), os.environ["CUDA_VISIBLE_DEVICES"], float(x.sum()))
    print("done", flush=True)
    time.sleep(60)
    """
)


async def _rank_on_gpu_0(
    workdir: Path,
    devices: list[Path],
    program: str = RANK_PROGRAM,
    share: GpuShare | None = None,
    agent_env: dict[str, str] | None = None,
    job_env: dict[str, str] | None = None,
    hide: Sequence[Path] = (),
) -> tuple[int, str, set[int]]:
    """A rank started as the agent starts one on GPU 0 of a real node (a whole GPU, or
    `share` of it), in bubblewrap with `devices` (and `hide` seen empty): its exit code (or 0
    while it still runs), its log, and the pids NVML said held GPU 0 while it ran."""
    placement = RankPlacement(rank=0, node_id="gpu-host", gpus=[0], share=share)
    spec = JobSpec.model_validate({"name": "probe", "team": "vision", "gpus_per_task": 1})
    env = {"PATH": os.environ["PATH"], "PYTHONUNBUFFERED": "1", **(job_env or {})}
    env.update(device_env(spec, placement, gpu_uuids={0: _uuid(0)}))
    pipes = isolation.mps_pipes(env, agent_env or {}, share=mps_share(spec, placement))
    argv = isolation.bwrap_argv(
        [sys.executable, "-c", program],
        state_dir=None,
        binds=[workdir, *pipes],
        workdir=workdir,
        devices=devices,
        hide=hide,
    )
    sandbox = isolation.Sandbox(argv, None, [], sandboxed=True)
    rank = await launch(RankKey("probe", 1, 0), placement, 1, argv, env, workdir, sandbox)
    holders: set[int] = set()
    deadline = time.monotonic() + 60
    log = workdir / "rank.log"
    while rank.running and time.monotonic() < deadline:
        holders = _gpu_pids(0) & _group(rank.pid)
        if holders and "done" in log.read_text():
            break
        await asyncio.sleep(0.2)
    code = 0 if rank.running else int(rank.process.returncode or 0)
    await rank.kill("probe over")
    await rank.end_leftovers(5.0)
    return code, log.read_text(), holders


def _group(pgid: int) -> set[int]:
    members = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.getpgid(int(entry.name)) == pgid:
                    members.add(int(entry.name))
            except ProcessLookupError:
                continue
    return members


@needs_cuda
@pytest.mark.skipif(not isolation.bwrap_works(), reason="no working bubblewrap here")
def test_a_sandboxed_rank_holds_its_gpu_while_it_runs_and_nothing_once_stopped(
    tmp_path: Path,
) -> None:
    devices = isolation.gpu_device_nodes([_uuid(0)])
    code, output, holders = asyncio.run(_rank_on_gpu_0(tmp_path / "with", devices))
    assert code == 0, output
    assert f"gpus 1 {_uuid(0)} 1048576.0" in output
    assert holders, "NVML never listed a process of the rank on GPU 0"
    deadline = time.monotonic() + 15
    while _gpu_pids(0) & holders and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _gpu_pids(0) & holders, "the stopped rank still holds GPU 0"
    # The fault this guards against: the sandbox's fresh /dev alone holds no GPU.
    code, output, _ = asyncio.run(_rank_on_gpu_0(tmp_path / "without", []))
    assert code != 0 and "No CUDA GPUs are available" in output


MPS_PROGRAM = textwrap.dedent(
    """
    import time, torch
    within = torch.empty(512 * 2**20, dtype=torch.uint8, device="cuda")
    print("512 MiB allocated", flush=True)
    try:
        over = torch.empty(3 * 2**30, dtype=torch.uint8, device="cuda")
        print("3 GiB allocated", flush=True)
    except torch.OutOfMemoryError:
        print("3 GiB refused", flush=True)
    print("done", flush=True)
    time.sleep(60)
    """
)


@pytest.fixture
def mps_daemon(tmp_path: Path) -> Iterator[dict[str, str]]:
    """An MPS control daemon of this test's own (its pipes and log in tmp_path): the agent's
    environment naming it."""
    control = shutil.which("nvidia-cuda-mps-control")
    if control is None:
        pytest.skip("no nvidia-cuda-mps-control on this host")
    env = {
        **os.environ,
        "CUDA_MPS_PIPE_DIRECTORY": str(tmp_path / "mps-pipes"),
        "CUDA_MPS_LOG_DIRECTORY": str(tmp_path / "mps-log"),
    }
    for name in ("mps-pipes", "mps-log"):
        (tmp_path / name).mkdir()
    subprocess.run([control, "-d"], env=env, check=True, timeout=30)
    yield {"CUDA_MPS_PIPE_DIRECTORY": env["CUDA_MPS_PIPE_DIRECTORY"]}
    subprocess.run([control], input=b"quit\n", env=env, check=False, timeout=30)


@needs_cuda
@pytest.mark.skipif(not isolation.bwrap_works(), reason="no working bubblewrap here")
def test_a_sandboxed_mps_share_reaches_the_daemon_and_is_held_to_its_memory(
    tmp_path: Path, mps_daemon: dict[str, str]
) -> None:
    share = GpuShare(thousandths=250, memory_mb=2_000, sharing="mps")
    devices = isolation.gpu_device_nodes([_uuid(0)])
    code, output, _ = asyncio.run(
        _rank_on_gpu_0(tmp_path / "mps", devices, MPS_PROGRAM, share, mps_daemon)
    )
    assert code == 0, output
    assert "512 MiB allocated" in output and "3 GiB refused" in output, output


@needs_cuda
@pytest.mark.skipif(not isolation.bwrap_works(), reason="no working bubblewrap here")
@pytest.mark.skipif(shutil.which(MPS_CONTROL) is None, reason="no nvidia-cuda-mps-control here")
def test_a_sandboxed_mps_share_reaches_the_agent_s_own_daemon_for_its_gpu(tmp_path: Path) -> None:
    """The agent's per-GPU daemon (services/agent/mps.py), started for GPU 0 as the agent
    starts it (that GPU's UUID only, its pipe and log directories of its own): the share,
    given that GPU's pipe directory and every other's hidden, reaches it and is held to its
    memory; the daemon is quit after it. The host's one daemon, serving one user at a time,
    made one team's share wait for another team's on any other GPU."""
    # Short: the daemon's sockets live in the pipe directory, and a socket's path has at most
    # 107 bytes (pytest's directories and a GPU's UUID come close).
    root = Path(tempfile.mkdtemp(prefix="gw-mps-", dir="/tmp"))
    daemons = MpsDaemons(root)
    share = GpuShare(thousandths=250, memory_mb=2_000, sharing="mps")
    devices = isolation.gpu_device_nodes([_uuid(0)])

    async def share_through_the_daemon() -> tuple[Path, tuple[int, str, set[int]]]:
        pipe = await daemons.acquire(_uuid(0), "probe")
        try:
            agent_env = {"CUDA_MPS_PIPE_DIRECTORY": str(pipe)}
            ran = await _rank_on_gpu_0(
                tmp_path / "mps", devices, MPS_PROGRAM, share, agent_env, hide=[root]
            )
        finally:
            await daemons.release(_uuid(0), "probe")
        return pipe, ran

    try:
        pipe, (code, output, _) = asyncio.run(share_through_the_daemon())
        assert code == 0, output
        assert "512 MiB allocated" in output and "3 GiB refused" in output, output
        # The daemon logged where the agent told it to, and its pipes are gone with it.
        assert (pipe.parent / "log" / "control.log").exists()
        assert not pipe.exists()
    finally:
        shutil.rmtree(root, ignore_errors=True)


@needs_cuda
@pytest.mark.skipif(not isolation.bwrap_works(), reason="no working bubblewrap here")
def test_a_whole_gpu_rank_setting_the_mps_variables_does_not_reach_the_daemon(
    tmp_path: Path, mps_daemon: dict[str, str]
) -> None:
    """A whole-GPU job that sets the MPS variables in its own env: were the daemon's pipes
    bound into its sandbox, its CUDA would run as an MPS client (held here to the 1,000 MB it
    asked itself, so 3 GiB refused), and other teams' MPS shares would queue behind its
    server. It runs on its own GPU directly instead."""
    job_env = {
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "10",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=1000M",
    }
    devices = isolation.gpu_device_nodes([_uuid(0)])
    code, output, _ = asyncio.run(
        _rank_on_gpu_0(tmp_path / "whole", devices, MPS_PROGRAM, None, mps_daemon, job_env)
    )
    assert code == 0, output
    assert "3 GiB allocated" in output, output
