"""What NVML says about a GPU's MIG: capability, mode, profile table, instances and their
device UUIDs. Read-only: nothing here creates, destroys or changes MIG (that is opt-in,
`GANGWAY_MIG_MANAGE=1`, and never done by tests).

`nvml` is the pynvml module (nvidia-ml-py) or a stand-in serving the same calls with the same
signatures (tests serve the table read from a real H100 80GB). The calls that list placements
and instances are NVML's C calls as they are: the caller passes a ctypes array and a count by
reference, which the driver fills.
"""

from __future__ import annotations

import ctypes
import logging
import math
import os
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

# NVML_GPU_INSTANCE_PROFILE_COUNT in the NVML headers; pynvml exports it where it knows it.
_PROFILE_COUNT = 15
# The profile indices of the media-extension variants (NVML_GPU_INSTANCE_PROFILE_*_REV1).
_MEDIA_EXTENSION_PROFILES = frozenset({7, 8})


@dataclass(frozen=True, slots=True)
class NvmlMigProfile:
    name: str  # "1g.10gb"
    profile_id: int
    slice_count: int
    instance_count: int
    memory_mb: int
    placements: tuple[tuple[int, int], ...]


@dataclass(frozen=True, slots=True)
class NvmlMigInstance:
    profile: str
    start: int
    uuid: str | None  # the MIG device's UUID, where a compute instance exposes one
    # The GPU instance's id and its MIG device's compute instance id: the driver's access
    # capabilities (/dev/nvidia-caps) of the slice are named by them.
    gpu_instance: int | None = None
    compute_instance: int | None = None


@dataclass(frozen=True, slots=True)
class NvmlMigGpu:
    index: int
    capable: bool
    enabled: bool
    profiles: tuple[NvmlMigProfile, ...] = ()
    instances: tuple[NvmlMigInstance, ...] = ()


def read_mig(nvml: Any, handle: Any, index: int) -> NvmlMigGpu:
    """One GPU's MIG facts; a GPU (or driver) without MIG is `capable=False`."""
    try:
        current, _pending = nvml.nvmlDeviceGetMigMode(handle)
    except Exception as error:  # NVMLError_NotSupported, or a stand-in without MIG calls
        log.debug("GPU %d: no MIG (%s)", index, error)
        return NvmlMigGpu(index=index, capable=False, enabled=False)
    profiles: list[NvmlMigProfile] = []
    by_id: dict[int, str] = {}
    capacity: dict[int, int] = {}
    for number in range(int(getattr(nvml, "NVML_GPU_INSTANCE_PROFILE_COUNT", _PROFILE_COUNT))):
        try:
            info = nvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, number)
        except Exception:  # the profile does not exist on this model
            continue
        name = _profile_name(nvml, handle, number, info)
        try:
            placements = _possible_placements(nvml, handle, int(info.id))
        except Exception:  # a driver that will not say: the profile is of no use to us
            log.warning("GPU %d: MIG profile %s has no readable placements", index, name)
            continue
        profiles.append(
            NvmlMigProfile(
                name=name,
                profile_id=int(info.id),
                slice_count=int(info.sliceCount),
                instance_count=int(info.instanceCount),
                memory_mb=int(info.memorySizeMB),
                placements=placements,
            )
        )
        by_id[int(info.id)] = name
        capacity[int(info.id)] = int(info.instanceCount)
    instances = _instances(nvml, handle, by_id, capacity) if current else ()
    return NvmlMigGpu(
        index=index,
        capable=True,
        enabled=bool(current),
        profiles=tuple(profiles),
        instances=instances,
    )


def _profile_name(nvml: Any, handle: Any, number: int, info: Any) -> str:
    reader = getattr(nvml, "nvmlDeviceGetGpuInstanceProfileInfoV", None)
    if reader is not None:
        try:
            named = reader(handle, number)
            raw = named.name.decode() if isinstance(named.name, bytes) else str(named.name)
            if raw:
                return raw.removeprefix("MIG ").strip()
        except Exception:  # older drivers: no versioned call; the name is derived instead
            log.debug("no versioned profile info for profile %d", number, exc_info=True)
    memory_gb = math.ceil(int(info.memorySizeMB) / 1024)
    suffix = "+me" if number in _MEDIA_EXTENSION_PROFILES else ""
    return f"{int(info.sliceCount)}g.{memory_gb}gb{suffix}"


def _possible_placements(nvml: Any, handle: Any, profile_id: int) -> tuple[tuple[int, int], ...]:
    """(start, size) of each place the profile may take. A profile's placements may outnumber
    its instances (1g.10gb+me: one instance, seven places), so the driver is asked their number
    first (a NULL array) and then fills an array of that size."""
    count = ctypes.c_uint(0)
    nvml.nvmlDeviceGetGpuInstancePossiblePlacements(handle, profile_id, None, ctypes.byref(count))
    placements = (nvml.c_nvmlGpuInstancePlacement_t * max(count.value, 1))()
    nvml.nvmlDeviceGetGpuInstancePossiblePlacements(
        handle, profile_id, placements, ctypes.byref(count)
    )
    return tuple((int(p.start), int(p.size)) for p in placements[: count.value])


def _gpu_instances(nvml: Any, handle: Any, profile_id: int, capacity: int) -> list[Any]:
    """The GPU instances of one profile; the array holds as many as the profile allows."""
    count = ctypes.c_uint(max(capacity, 1))
    instances = (nvml.c_nvmlGpuInstance_t * count.value)()
    nvml.nvmlDeviceGetGpuInstances(handle, profile_id, instances, ctypes.byref(count))
    return list(instances[: count.value])


def _instances(
    nvml: Any, handle: Any, by_id: dict[int, str], capacity: dict[int, int]
) -> tuple[NvmlMigInstance, ...]:
    """The GPU instances that exist, with the MIG device UUID of each (by GPU instance id)."""
    starts: dict[int, tuple[str, int]] = {}
    for profile_id, name in by_id.items():
        try:
            handles = _gpu_instances(nvml, handle, profile_id, capacity[profile_id])
        except Exception:
            log.debug("GPU instances of profile %d unreadable", profile_id, exc_info=True)
            continue
        for instance in handles:
            # One instance NVML will not describe (a GPU falling off the bus answers
            # NVML_ERROR_GPU_IS_LOST) is left out, not the host's whole discovery.
            try:
                info = nvml.nvmlGpuInstanceGetInfo(instance)
            except Exception:
                log.warning("a GPU instance of profile %d unreadable", profile_id, exc_info=True)
                continue
            starts[int(info.id)] = (name, int(info.placement.start))
    # GPU instance id -> its MIG device's UUID and compute instance id.
    devices: dict[int, tuple[str | None, int | None]] = {}
    try:
        count = int(nvml.nvmlDeviceGetMaxMigDeviceCount(handle))
    except Exception:
        count = 0
    for number in range(count):
        try:
            device = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, number)
        except Exception:  # an empty MIG device slot
            continue
        try:
            uuid = nvml.nvmlDeviceGetUUID(device)
            gi = int(nvml.nvmlDeviceGetGpuInstanceId(device))
        except Exception:  # its instance is listed without a UUID, which no rank is given
            log.warning("MIG device %d unreadable", number, exc_info=True)
            continue
        try:
            ci: int | None = int(nvml.nvmlDeviceGetComputeInstanceId(device))
        except Exception:  # its UUID still names it to CUDA; its sandbox cannot be built
            log.warning("MIG device %d: compute instance unreadable", number, exc_info=True)
            ci = None
        devices[gi] = (uuid.decode() if isinstance(uuid, bytes) else str(uuid), ci)
    found = []
    for gi, (name, start) in starts.items():
        named, compute = devices.get(gi, (None, None))
        found.append(NvmlMigInstance(name, start, named, gpu_instance=gi, compute_instance=compute))
    return tuple(sorted(found, key=lambda instance: instance.start))


def mig_uuids(gpus: list[NvmlMigGpu]) -> dict[tuple[int, int], str]:
    """(GPU index, instance start) → MIG device UUID: what the agent puts in a slice rank's
    CUDA_VISIBLE_DEVICES on a real node."""
    return {
        (gpu.index, instance.start): instance.uuid
        for gpu in gpus
        for instance in gpu.instances
        if instance.uuid is not None
    }


def mig_instance_ids(gpu: NvmlMigGpu, start: int) -> tuple[int, int] | None:
    """(GPU instance id, compute instance id) of the slice at `start`, as the driver's access
    capabilities name it; None where NVML listed no such slice or not both ids."""
    for instance in gpu.instances:
        if instance.start == start:
            if instance.gpu_instance is None or instance.compute_instance is None:
                return None
            return instance.gpu_instance, instance.compute_instance
    return None


def mig_managed() -> bool:
    """Whether the operator lets Gangway create and destroy MIG instances on this host."""
    return os.environ.get("GANGWAY_MIG_MANAGE", "") == "1"


def host_resources() -> tuple[int | None, int | None]:
    """This host's CPUs and memory (MB), read from the OS; None where it does not say."""
    cpus = os.cpu_count()
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // (1024 * 1024)
    except (ValueError, OSError, AttributeError):
        memory = 0
    return cpus, memory or None
