"""Which device nodes a sandboxed rank may open: its own GPUs' and the driver's shared ones.

On a real H100 host a rank in bubblewrap saw no GPU at all (`RuntimeError: No CUDA GPUs are
available`): the sandbox's fresh /dev holds no /dev/nvidia* node. The driver's listing and
/dev are built here in tmp_path as the driver lays them out (the `information` text is what a
real H100 80GB host's driver printed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from schemas.jobs import GpuShare, JobSpec, RankPlacement
from services.agent import isolation
from services.agent.devices import mps_share
from services.agent.plan import rank_env

H100_INFORMATION = """Model: \t\t NVIDIA H100 80GB HBM3
IRQ:   \t\t 41
GPU UUID: \t GPU-57f0c059-4aa7-8e33-d17a-8f91c82e20d2
Video BIOS: \t 96.00.da.00.0c
Bus Type: \t PCIe
DMA Size: \t 52 bits
DMA Mask: \t 0xfffffffffffff
Bus Location: \t 0000:00:06.0
Device Minor: \t 0
GPU Firmware: \t 580.159.04
GPU Excluded:\t No
"""
FIRST = "GPU-57f0c059-4aa7-8e33-d17a-8f91c82e20d2"
SECOND = "GPU-0b1e6a2f-3c4d-4e5f-8a9b-0c1d2e3f4a5b"


def _host(tmp_path: Path) -> tuple[Path, Path]:
    """Two GPUs whose minors are not their PCI order (minor 3 comes first), and /dev."""
    gpus, dev = tmp_path / "gpus", tmp_path / "dev"
    for address, text in (
        ("0000:00:06.0", H100_INFORMATION.replace("Minor: \t 0", "Minor: \t 3")),
        ("0000:00:07.0", H100_INFORMATION.replace(FIRST, SECOND)),
    ):
        (gpus / address).mkdir(parents=True)
        (gpus / address / "information").write_text(text)
    dev.mkdir()
    for name in ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia0", "nvidia3"):
        (dev / name).touch()
    (dev / "nvidia-caps").mkdir()
    return gpus, dev


def test_the_driver_s_information_gives_a_gpu_s_uuid_and_device_minor() -> None:
    assert isolation.gpu_minor(H100_INFORMATION) == (FIRST, 0)
    assert isolation.gpu_minor("Model: NVIDIA H100\n") is None


def test_a_rank_gets_its_own_gpus_nodes_by_minor_and_the_shared_ones_and_no_other(
    tmp_path: Path,
) -> None:
    gpus, dev = _host(tmp_path)
    nodes = isolation.gpu_device_nodes([FIRST], gpus=gpus, dev=dev)
    assert sorted(node.name for node in nodes) == [
        "nvidia-uvm",
        "nvidia-uvm-tools",
        "nvidia3",  # the first GPU's minor, not its index
        "nvidiactl",
    ]
    other = isolation.gpu_device_nodes([SECOND], gpus=gpus, dev=dev)
    assert dev / "nvidia0" in other and dev / "nvidia3" not in other


def test_a_cpu_only_rank_opens_no_gpu_device(tmp_path: Path) -> None:
    gpus, dev = _host(tmp_path)
    assert isolation.gpu_device_nodes([], gpus=gpus, dev=dev) == []


def test_a_gpu_the_driver_does_not_list_fails_the_launch(tmp_path: Path) -> None:
    gpus, dev = _host(tmp_path)
    with pytest.raises(isolation.IsolationError, match="lists no GPU GPU-dead"):
        isolation.gpu_device_nodes(["GPU-dead"], gpus=gpus, dev=dev)


def test_the_sandbox_binds_the_rank_s_devices_into_its_fresh_dev(tmp_path: Path) -> None:
    nodes = [Path("/dev/nvidiactl"), Path("/dev/nvidia3")]
    argv = isolation.bwrap_argv(
        ["python"], state_dir=None, binds=[], workdir=tmp_path, keep=[], devices=nodes
    )
    fresh = argv.index("--dev")
    binds = [argv[i + 1] for i, word in enumerate(argv) if word == "--dev-bind"]
    assert binds == ["/dev/nvidiactl", "/dev/nvidia3"]
    # bwrap applies its arguments in order: a bind before --dev would be covered by it.
    assert all(i > fresh for i, word in enumerate(argv) if word == "--dev-bind")


def test_an_mps_share_binds_the_daemon_s_pipes_and_looks_for_it_there(tmp_path: Path) -> None:
    pipes = tmp_path / "mps"
    pipes.mkdir()
    agent_env = {"CUDA_MPS_PIPE_DIRECTORY": str(pipes)}
    share = {"CUDA_VISIBLE_DEVICES": FIRST, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25"}
    assert isolation.mps_pipes(share, agent_env, share=True) == [pipes]
    assert share["CUDA_MPS_PIPE_DIRECTORY"] == str(pipes)
    whole = {"CUDA_VISIBLE_DEVICES": FIRST}
    assert isolation.mps_pipes(whole, agent_env, share=False) == []
    assert "CUDA_MPS_PIPE_DIRECTORY" not in whole
    no_daemon = {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25"}
    no = {"CUDA_MPS_PIPE_DIRECTORY": str(tmp_path / "no")}
    assert isolation.mps_pipes(no_daemon, no, share=True) == []


def test_a_whole_gpu_rank_whose_job_sets_the_mps_variables_gets_no_daemon(
    tmp_path: Path,
) -> None:
    """Attack: a whole-GPU job of team A sets CUDA_MPS_ACTIVE_THREAD_PERCENTAGE in its own
    `env`. The sandbox bound the MPS daemon's pipes into its rank because the rank's env
    held the variable: its CUDA then ran as a client of the host's daemon, which runs one
    user's server at a time, and queued every other team's MPS shares behind it, on any GPU.
    Only the ledger's MPS share reaches the daemon."""
    pipes = tmp_path / "mps"
    pipes.mkdir()
    job = JobSpec(
        name="t",
        team="a",
        tasks=1,
        gpus_per_task=1,
        command=["python"],
        env={"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "1"},
    )
    whole = RankPlacement(rank=0, node_id="gpu-host", gpus=[0])
    env = rank_env(
        spec=job,
        job_id="j1",
        attempt=1,
        placement=whole,
        world_size=1,
        checkpoint_dir=None,
        checkpoint_request=tmp_path / "req.json",
        agent_env={},
        gpu_uuids={0: FIRST},
    )
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "1"  # the job's own, as it asked
    agent_env = {"CUDA_MPS_PIPE_DIRECTORY": str(pipes)}
    assert isolation.mps_pipes(env, agent_env, share=mps_share(job, whole)) == []
    share = RankPlacement(
        rank=0,
        node_id="gpu-host",
        gpus=[0],
        share=GpuShare(thousandths=250, memory_mb=2000, sharing="mps"),
    )
    fraction = job.model_copy(update={"gpus_per_task": 1, "gpu_fraction": 0.25, "env": {}})
    assert mps_share(fraction, share)
    assert not mps_share(fraction, share.model_copy(update={"share": None, "gpus": []}))
    timeslice = share.model_copy(
        update={"share": GpuShare(thousandths=250, memory_mb=None, sharing="timeslice")}
    )
    assert not mps_share(fraction, timeslice)


def test_odd_digits_in_the_driver_s_listing_name_no_minor() -> None:
    """'²'.isdigit() is True and int('²') raises: a listing with it failed the launch with a
    ValueError rather than naming no GPU."""
    for odd in ("²", "٣", "-1", "3a", ""):
        text = H100_INFORMATION.replace("Minor: \t 0", f"Minor: \t {odd}")
        assert isolation.gpu_minor(text) is None, odd


def test_another_gpu_s_undecodable_listing_does_not_fail_this_rank_s_launch(
    tmp_path: Path,
) -> None:
    """The UnicodeDecodeError of one GPU's `information` (a ValueError, which the launch
    counts as a permanent failure) failed every launch on the host."""
    gpus, dev = _host(tmp_path)
    (gpus / "0000:00:07.0" / "information").write_bytes(b"GPU UUID: \xff\xfe\nDevice Minor: 0\n")
    (gpus / "0000:00:08.0").mkdir()
    (gpus / "0000:00:08.0" / "information").symlink_to(gpus / "0000:00:08.0" / "information")
    (gpus / "0000:00:09.0").mkdir()
    (gpus / "0000:00:09.0" / "information").mkdir()
    nodes = isolation.gpu_device_nodes([FIRST], gpus=gpus, dev=dev)
    assert dev / "nvidia3" in nodes and dev / "nvidia0" not in nodes


def test_a_gpu_without_its_device_node_fails_the_launch_rather_than_starting_without_it(
    tmp_path: Path,
) -> None:
    """A GPU the driver still lists but whose /dev/nvidia<minor> is gone (fallen off the bus
    and removed, or never created in a container): its node was silently left out, and the
    rank started with no GPU at all, to fail as if its own program had."""
    gpus, dev = _host(tmp_path)
    (dev / "nvidia3").unlink()
    with pytest.raises(isolation.IsolationError, match=r"no device node .*nvidia3"):
        isolation.gpu_device_nodes([FIRST], gpus=gpus, dev=dev)
    assert dev / "nvidia0" in isolation.gpu_device_nodes([SECOND], gpus=gpus, dev=dev)


def _access(minor: int) -> str:
    """A capability's `access` file as the driver prints it."""
    return f"DeviceFileMinor: {minor}\nDeviceFileMode: 292\nDeviceFileModify: 1\n"


def _mig_host(tmp_path: Path) -> tuple[Path, Path, Path]:
    """The first GPU (minor 3) in MIG mode holding two slices, GPU instances 1 and 2 (each with
    compute instance 0), of two teams; the config and monitor capabilities besides."""
    gpus, dev = _host(tmp_path)
    capabilities = tmp_path / "capabilities"
    for gi, ci_minor in ((1, 12), (2, 21)):
        (capabilities / "gpu3" / "mig" / f"gi{gi}" / "ci0").mkdir(parents=True)
        (capabilities / "gpu3" / "mig" / f"gi{gi}" / "access").write_text(_access(ci_minor - 1))
        (capabilities / "gpu3" / "mig" / f"gi{gi}" / "ci0" / "access").write_text(_access(ci_minor))
    for minor in (1, 2, 11, 12, 20, 21):
        (dev / "nvidia-caps" / f"nvidia-cap{minor}").touch()
    return gpus, dev, capabilities


def test_a_slice_rank_gets_its_own_slice_s_capabilities_and_no_other_slice_s(
    tmp_path: Path,
) -> None:
    """Attack: two teams' slices on one GPU (MIG slices may mix teams, DESIGN). The sandbox
    bound the whole /dev/nvidia-caps, whose nodes grant access to every slice of the host
    (mode 0444 by default): team A's rank, holding the GPU's /dev/nvidia<minor> too, could
    name team B's MIG device in its CUDA_VISIBLE_DEVICES and run on B's slice."""
    gpus, dev, capabilities = _mig_host(tmp_path)
    nodes = isolation.gpu_device_nodes(
        [FIRST], mig=(1, 0), gpus=gpus, dev=dev, capabilities=capabilities
    )
    caps = [node.name for node in nodes if node.parent.name == "nvidia-caps"]
    assert caps == ["nvidia-cap11", "nvidia-cap12"]  # its GPU instance's, its compute's
    assert dev / "nvidia-caps" not in nodes
    other = isolation.gpu_device_nodes(
        [FIRST], mig=(2, 0), gpus=gpus, dev=dev, capabilities=capabilities
    )
    assert [node.name for node in other if node.parent.name == "nvidia-caps"] == [
        "nvidia-cap20",
        "nvidia-cap21",
    ]
    whole = isolation.gpu_device_nodes([SECOND], gpus=gpus, dev=dev, capabilities=capabilities)
    assert not [node for node in whole if "nvidia-cap" in str(node)]


def test_a_slice_the_driver_lists_no_capability_of_fails_the_launch(tmp_path: Path) -> None:
    gpus, dev, capabilities = _mig_host(tmp_path)
    with pytest.raises(isolation.IsolationError, match="no MIG capability"):
        isolation.gpu_device_nodes(
            [FIRST], mig=(5, 0), gpus=gpus, dev=dev, capabilities=capabilities
        )
    (capabilities / "gpu3" / "mig" / "gi1" / "access").write_text("DeviceFileMinor: ²\n")
    with pytest.raises(isolation.IsolationError, match="names no device minor"):
        isolation.gpu_device_nodes(
            [FIRST], mig=(1, 0), gpus=gpus, dev=dev, capabilities=capabilities
        )
