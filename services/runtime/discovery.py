"""Node discovery: NVML where a driver loads, the cluster spec otherwise.

Both paths end in the same NodeRegistered events, so everything after discovery (registration,
liveness, scheduling) runs the same code on real GPUs and on a simulated fleet.
"""

from __future__ import annotations

import logging
import socket
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from core.mig import MigModel, mig_model, pack
from core.topology import parse_cluster_spec
from schemas.nodes import GpuInfo, MigMode, NodeRegistered
from services.runtime.mig_discovery import NvmlMigGpu, host_resources, mig_managed, read_mig

log = logging.getLogger(__name__)


def load_cluster_spec(value: str) -> list[NodeRegistered]:
    """The nodes of `value`: a shorthand (`16x8:4:2`), a path to a YAML file, or YAML text."""
    candidate = value.strip()
    if "\n" not in candidate:
        path = Path(candidate)
        if path.is_file() or candidate.endswith((".yaml", ".yml")):
            return parse_cluster_spec(path.read_text())  # a missing .yaml file: say so
    return parse_cluster_spec(value)


def import_nvml() -> Any:
    """The pynvml module (nvidia-ml-py's API), or None where it is not installed."""
    try:
        # The pynvml shim warns that nvidia-ml-py supersedes it; both give the same API.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            import pynvml
    except ImportError:
        return None
    return pynvml


def nvml_node(
    *,
    node_id: str | None = None,
    rack: str,
    block: str,
    labels: Mapping[str, str] | None = None,
    nvml: Any = None,
) -> NodeRegistered | None:
    """This host as a node, read from NVML; None when no driver loads (or it has no GPU).

    `nvml` is the pynvml module (a parameter so a fake driver can stand in for it).
    """
    if nvml is None:
        nvml = import_nvml()
        if nvml is None:
            return None
    try:
        nvml.nvmlInit()
    except Exception as error:  # NVMLError_LibraryNotFound, _DriverNotLoaded … : no GPUs here
        log.info("NVML unavailable (%s); using the cluster spec", error)
        return None
    try:
        count = int(nvml.nvmlDeviceGetCount())
        gpus = []
        lost: list[int] = []
        migs: list[NvmlMigGpu] = []
        handles: list[Any] = []
        for index in range(count):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                memory = nvml.nvmlDeviceGetMemoryInfo(handle)
                gpu = GpuInfo(
                    index=index,
                    uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
                    model=_text(nvml.nvmlDeviceGetName(handle)),
                    memory_mb=int(memory.total) // (1024 * 1024),
                )
            except Exception as error:  # NVMLError_GpuIsLost …: the GPU fell off the bus
                log.warning("GPU %d unreadable at discovery (%s): registered as lost", index, error)
                lost.append(index)
                continue
            gpus.append(gpu)
            handles.append(handle)
            migs.append(read_mig(nvml, handle, index))
        nvlink = joined_by_nvlink(nvml, handles)
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:  # shutting down a half-initialised driver is not worth failing for
            log.debug("nvmlShutdown failed", exc_info=True)
    if not gpus:
        if lost:
            # Not the cluster spec's fleet in its place: this host has GPUs, none readable.
            raise RuntimeError(f"NVML lists {count} GPUs on this host and none can be read")
        return None
    hostname = socket.gethostname()
    name = node_id or hostname
    # A lost GPU keeps its place (NVML's index) and is reported lost by every heartbeat
    # (services/agent/heartbeats.py), which health turns into GpuUnhealthy and a drain.
    for index in lost:
        gpus.append(
            GpuInfo(index=index, uuid=f"GPU-lost-{index}", model=gpus[0].model, memory_mb=0)
        )
    gpus.sort(key=lambda gpu: gpu.index)
    table = mig_model(gpus[0].model)
    mig, profiles = _mig_of(migs, table)
    cpus, memory_mb = host_resources()
    return NodeRegistered(
        node_id=name,
        hostname=hostname,
        gpu_type=gpu_type_of(gpus[0].model),
        gpus=gpus,
        rack=rack,
        block=block,
        nvlink_domain=name,
        nvlink=nvlink,
        labels=dict(labels or {}),
        discovered_by="nvml",
        cpus=cpus,
        memory_mb=memory_mb,
        gpu_model=None if table is None else table.name,
        mig=mig,
        mig_profiles=profiles,
    )


def joined_by_nvlink(nvml: Any, handles: list[Any]) -> bool:
    """Whether NVLink joins every pair of the host's GPUs (NVML's peer-to-peer NVLink status):
    the node is then one NVLink domain. GPUs on PCIe alone, or bridged in pairs only, are not,
    and a tensor-parallel group of several GPUs is then never placed there. A GPU that cannot
    say (an NVML error, a driver without the call) counts as not joined: a group placed over
    PCIe runs, but at a fraction of the speed its owner asked for."""
    for first, handle in enumerate(handles):
        for other in handles[first + 1 :]:
            try:
                status = nvml.nvmlDeviceGetP2PStatus(handle, other, nvml.NVML_P2P_CAPS_INDEX_NVLINK)
            except Exception as error:  # NVMLError_NotSupported …
                log.info("NVLink between GPUs unknown (%s): the node has no NVLink domain", error)
                return False
            if status != nvml.NVML_P2P_STATUS_OK:
                return False
    return True


def _mig_of(migs: list[NvmlMigGpu], table: MigModel | None) -> tuple[MigMode, list[str]]:
    """The node's MIG mode: dynamic where the operator lets Gangway manage MIG on capable
    GPUs, fixed to the instances GPU 0 holds where MIG is on (and they form a geometry of
    the model's table), none otherwise."""
    if table is None or not migs or not all(gpu.capable for gpu in migs):
        return "none", []
    if mig_managed():
        return "dynamic", []
    profiles = [instance.profile for instance in migs[0].instances]
    if migs[0].enabled and profiles and pack(table, profiles) is not None:
        return "fixed", profiles
    return "none", []


def gpu_type_of(model: str) -> str:
    """The scheduler's GPU type from NVML's product name: `NVIDIA H100 80GB HBM3` → `H100`."""
    words = [w for w in model.replace("-", " ").split() if w.upper() not in {"NVIDIA", "TESLA"}]
    return words[0] if words else model


def discover(
    cluster: str,
    *,
    mode: str = "auto",
    node_id: str | None = None,
    rack: str = "r000",
    block: str = "b00",
    labels: Mapping[str, str] | None = None,
    nvml: Any = None,
) -> list[NodeRegistered]:
    """The nodes this process answers for: NVML's (mode auto/nvml), else the cluster spec's."""
    if mode in ("auto", "nvml"):
        node = nvml_node(node_id=node_id, rack=rack, block=block, labels=labels, nvml=nvml)
        if node is not None:
            return [node]
        if mode == "nvml":
            raise RuntimeError("discovery=nvml but no NVIDIA driver or GPU was found")
    return load_cluster_spec(cluster)


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
