"""NVML discovery of MIG, against a stand-in driver serving what NVML reported on a real H100
80GB (tests/fixtures/hardware/): capability, mode, the profile table with its placements,
instances and their MIG device UUIDs. Read-only: nothing here changes MIG."""

from __future__ import annotations

import ctypes
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from core.mig import H100_80GB, MigModel
from services.runtime.discovery import import_nvml, nvml_node
from services.runtime.mig_discovery import NvmlMigGpu, mig_instance_ids, mig_uuids, read_mig

pynvml = import_nvml()
HARDWARE = Path(__file__).parents[1] / "fixtures" / "hardware" / "h100-80gb-hbm3.nvml.json"


@dataclass
class Memory:
    total: int


@dataclass
class ProfileInfo:
    id: int
    sliceCount: int  # NVML's field names
    instanceCount: int
    memorySizeMB: int
    name: bytes = b""


@dataclass
class Placement:
    start: int
    size: int


@dataclass
class InstanceInfo:
    id: int
    profileId: int
    placement: Placement


class NvmlError(Exception):
    pass


def _filled(count_ref: Any, array: Any, rows: list[Any]) -> None:
    """What NVML's C calls do with a caller's array and count: a NULL array asks the count, a
    short one is refused, else the rows are written and the count says how many."""
    count = count_ref._obj  # the c_uint that ctypes.byref wraps
    if array is None:
        count.value = len(rows)
        return
    if count.value < len(rows) or len(array) < count.value:
        raise NvmlError("Insufficient Size")
    for slot, row in enumerate(rows):
        array[slot] = row
    count.value = len(rows)


class StoredH100:
    """The NVML calls discovery makes, with nvidia-ml-py's signatures, answered from the stored
    real H100 table; `instances` (profile name, start) stand for GPU instances created on a
    MIG-enabled GPU (a GPU instance handle is its number here)."""

    c_nvmlGpuInstancePlacement_t = pynvml.c_nvmlGpuInstancePlacement_t
    c_nvmlGpuInstance_t = ctypes.c_uint

    def __init__(self, instances: tuple[tuple[str, int], ...] = ()) -> None:
        self.table = json.loads(HARDWARE.read_text())
        self.instances = instances
        self.mode = 1 if instances else 0

    def nvmlInit(self) -> None:
        pass

    def nvmlShutdown(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return 1

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> Memory:
        return Memory(total=self.table["memory_mb"] * 1024 * 1024)

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        if isinstance(handle, tuple):
            return f"MIG-0000000{handle[1]}-aaaa-bbbb-cccc-dddddddddddd"
        return "GPU-4c3d2e1f-0000-1111-2222-333344445555"

    def nvmlDeviceGetName(self, handle: int) -> bytes:
        return str(self.table["model"]).encode()

    def nvmlDeviceGetMigMode(self, handle: int) -> list[int]:
        return [self.mode, self.mode]

    def _row(self, number: int) -> dict[str, Any]:
        for row in self.table["profiles"]:
            if row["profile"] == number:
                return dict(row)
        raise NvmlError("Not Supported")

    def nvmlDeviceGetGpuInstanceProfileInfo(self, handle: int, number: int) -> ProfileInfo:
        row = self._row(number)
        return ProfileInfo(row["id"], row["slice_count"], row["instance_count"], row["memory_mb"])

    def nvmlDeviceGetGpuInstanceProfileInfoV(self, handle: int, number: int) -> ProfileInfo:
        info = self.nvmlDeviceGetGpuInstanceProfileInfo(handle, number)
        info.name = self._row(number)["name"].encode()
        return info

    def nvmlDeviceGetGpuInstancePossiblePlacements(
        self, handle: int, profile_id: int, placements: Any, count: Any
    ) -> int:
        for row in self.table["profiles"]:
            if row["id"] == profile_id:
                places = [
                    pynvml.c_nvmlGpuInstancePlacement_t(p["start"], p["size"])
                    for p in row["placements"]
                ]
                _filled(count, placements, places)
                return 0
        raise NvmlError("Invalid Argument")

    def _id_of(self, name: str) -> int:
        return int(next(r["id"] for r in self.table["profiles"] if r["name"] == f"MIG {name}"))

    def nvmlDeviceGetGpuInstances(
        self, handle: int, profile_id: int, instances: Any, count: Any
    ) -> int:
        found = [
            gi for gi, (name, _) in enumerate(self.instances) if self._id_of(name) == profile_id
        ]
        _filled(count, instances, found)
        return 0

    def nvmlGpuInstanceGetInfo(self, gi: int) -> InstanceInfo:
        name, start = self.instances[gi]
        return InstanceInfo(gi, self._id_of(name), Placement(start, 1))

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: int) -> int:
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: int, number: int) -> tuple[int, int]:
        if number >= len(self.instances):
            raise NvmlError("Not Found")
        return (handle, number)

    def nvmlDeviceGetGpuInstanceId(self, device: tuple[int, int]) -> int:
        return device[1]

    def nvmlDeviceGetComputeInstanceId(self, device: tuple[int, int]) -> int:
        return 0  # one compute instance of the whole GPU instance, as Gangway creates them


Row = tuple[int, int, int, int, tuple[tuple[int, int], ...]]


def read_table(gpu: NvmlMigGpu) -> dict[str, Row]:
    """The profile table NVML gave, as (profile id, slices, instances, MB, placements) by name."""
    return {
        p.name: (p.profile_id, p.slice_count, p.instance_count, p.memory_mb, p.placements)
        for p in gpu.profiles
    }


def core_table(model: MigModel) -> dict[str, Row]:
    """core/mig.py's table of `model`, in the same shape."""
    return {
        name: (p.profile_id, p.compute_slices, p.instance_count, p.memory_mb, p.placements)
        for name, p in model.profiles.items()
    }


def test_the_profile_table_nvml_reports_is_the_core_s_h100_table() -> None:
    gpu = read_mig(StoredH100(), 0, 0)
    assert (gpu.capable, gpu.enabled, gpu.instances) == (True, False, ())
    assert read_table(gpu) == core_table(H100_80GB)


def test_existing_instances_and_their_mig_device_uuids_are_read() -> None:
    driver = StoredH100(instances=(("3g.40gb", 4), ("2g.20gb", 0)))
    gpu = read_mig(driver, 0, 0)
    assert gpu.enabled
    assert [(i.profile, i.start) for i in gpu.instances] == [("2g.20gb", 0), ("3g.40gb", 4)]
    uuids = mig_uuids([gpu])
    assert uuids[(0, 4)].startswith("MIG-") and uuids[(0, 0)] != uuids[(0, 4)]


def test_a_host_node_declares_its_model_mig_mode_cpus_and_memory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("GANGWAY_MIG_MANAGE", raising=False)
    node = nvml_node(rack="r0", block="b0", nvml=StoredH100())
    assert node is not None
    assert (node.gpu_type, node.gpu_model, node.mig) == ("H100", "H100-80GB", "none")
    assert node.cpus is not None and node.cpus >= 1
    assert node.memory_mb is not None and node.memory_mb > 0
    fixed = nvml_node(rack="r0", block="b0", nvml=StoredH100((("3g.40gb", 4), ("4g.40gb", 0))))
    assert fixed is not None and fixed.mig == "fixed"
    assert sorted(fixed.mig_profiles) == ["3g.40gb", "4g.40gb"]
    monkeypatch.setenv("GANGWAY_MIG_MANAGE", "1")
    managed = nvml_node(rack="r0", block="b0", nvml=StoredH100())
    assert managed is not None and managed.mig == "dynamic"


@pytest.mark.parametrize(
    "call", ["nvmlGpuInstanceGetInfo", "nvmlDeviceGetUUID", "nvmlDeviceGetGpuInstanceId"]
)
def test_an_instance_nvml_cannot_read_leaves_it_out_not_the_host(call: str) -> None:
    """NVML answering an error (NVML_ERROR_GPU_IS_LOST, say) for one GPU instance or MIG device
    raised out of read_mig: the agent could not discover its host at all, and a slice's
    launch (which reads the instances again) raised out of the launch."""
    driver = StoredH100(instances=(("3g.40gb", 4), ("4g.40gb", 0)))
    real = getattr(driver, call)

    def lost(*args: Any) -> Any:
        if call == "nvmlDeviceGetUUID" and not isinstance(args[0], tuple):
            return real(*args)  # the GPU's own UUID reads; its MIG devices' do not
        if call == "nvmlGpuInstanceGetInfo" and args[0] == 0:
            return real(*args)  # the 3g.40gb instance (the first) reads, the 4g.40gb not
        raise NvmlError("GPU is lost")

    setattr(driver, call, lost)
    gpu = read_mig(driver, 0, 0)
    if call == "nvmlGpuInstanceGetInfo":
        assert [(i.profile, i.start) for i in gpu.instances] == [("3g.40gb", 4)]
    else:
        assert {(i.profile, i.start) for i in gpu.instances} == {("3g.40gb", 4), ("4g.40gb", 0)}
        assert mig_uuids([gpu]) == {}
    assert nvml_node(rack="r0", block="b0", nvml=driver) is not None


def test_a_slice_s_gpu_and_compute_instance_ids_are_read_for_its_sandbox() -> None:
    """The ids the driver's access capabilities of a slice are named by (the sandbox binds
    those two nodes of /dev/nvidia-caps and no other slice's)."""
    driver = StoredH100(instances=(("3g.40gb", 4), ("2g.20gb", 0)))
    gpu = read_mig(driver, 0, 0)
    assert mig_instance_ids(gpu, 4) == (0, 0)
    assert mig_instance_ids(gpu, 0) == (1, 0)
    assert mig_instance_ids(gpu, 2) is None  # no slice there

    class NoComputeId(StoredH100):
        def nvmlDeviceGetComputeInstanceId(self, device: tuple[int, int]) -> int:
            raise NvmlError("GPU is lost")

    unnamed = read_mig(NoComputeId(instances=(("3g.40gb", 4),)), 0, 0)
    assert mig_instance_ids(unnamed, 4) is None
    assert mig_uuids([unnamed]) == {(0, 4): "MIG-00000000-aaaa-bbbb-cccc-dddddddddddd"}
