"""Discovery: the cluster spec where no driver loads, NVML's view of the host where one does."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from schemas.nodes import NodeRegistered
from services.inventory.service import registrations_to_append
from services.runtime.discovery import discover, gpu_type_of, load_cluster_spec, nvml_node


class NoDriver:
    """Stands in for pynvml on a machine without the NVIDIA driver."""

    class NVMLError(Exception):
        pass

    def nvmlInit(self) -> None:
        raise self.NVMLError("NVML Shared Library Not Found")


@dataclass
class Memory:
    total: int


class FakeDriver:
    """A driver with `count` GPUs of one model: the NVML calls discovery makes, and no more.
    NVLink joins every pair of GPUs unless `nvlink` names the pairs it joins."""

    NVML_P2P_CAPS_INDEX_NVLINK = 2
    NVML_P2P_STATUS_OK = 0
    NVML_P2P_STATUS_NOT_SUPPORTED = 5

    def __init__(
        self,
        count: int,
        name: bytes = b"NVIDIA H100 80GB HBM3",
        nvlink: set[frozenset[int]] | None = None,
    ) -> None:
        self.count = count
        self.name = name
        self.nvlink = nvlink
        self.shut_down = False

    def nvmlInit(self) -> None:
        pass

    def nvmlShutdown(self) -> None:
        self.shut_down = True

    def nvmlDeviceGetCount(self) -> int:
        return self.count

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> Memory:
        return Memory(total=80 * 1024**3)

    def nvmlDeviceGetUUID(self, handle: int) -> str:
        return f"GPU-{handle:08d}"

    def nvmlDeviceGetName(self, handle: int) -> bytes:
        return self.name

    def nvmlDeviceGetP2PStatus(self, first: int, other: int, caps: int) -> int:
        assert caps == self.NVML_P2P_CAPS_INDEX_NVLINK
        if self.nvlink is None or frozenset((first, other)) in self.nvlink:
            return self.NVML_P2P_STATUS_OK
        return self.NVML_P2P_STATUS_NOT_SUPPORTED


def test_the_demo_shorthand_gives_sixteen_nodes_of_eight_gpus_in_two_blocks() -> None:
    nodes = load_cluster_spec("16x8:4:2")
    assert len(nodes) == 16
    assert sum(len(n.gpus) for n in nodes) == 128
    assert {n.rack for n in nodes} == {"r000", "r001", "r002", "r003"}
    assert {n.block for n in nodes} == {"b00", "b01"}
    assert {n.discovered_by for n in nodes} == {"spec"}


def test_a_yaml_file_path_is_read_as_the_spec(tmp_path: Path) -> None:
    spec = tmp_path / "cluster.yaml"
    spec.write_text("groups:\n  - {count: 2, gpus: 4, gpu_type: A100, rack: ra, block: ba}\n")
    nodes = load_cluster_spec(str(spec))
    assert [(n.gpu_type, len(n.gpus), n.rack) for n in nodes] == [("A100", 4, "ra")] * 2


def test_without_a_driver_discovery_falls_back_to_the_spec() -> None:
    assert nvml_node(rack="r0", block="b0", nvml=NoDriver()) is None
    nodes = discover("2x8", mode="auto", nvml=NoDriver())
    assert [n.node_id for n in nodes] == ["n0000", "n0001"]


def test_nvml_discovery_reports_every_gpu_of_the_host() -> None:
    driver = FakeDriver(count=4)
    node = nvml_node(node_id="host-a", rack="r7", block="b1", labels={"zone": "z"}, nvml=driver)
    assert node is not None
    assert node.discovered_by == "nvml"
    assert node.gpu_type == "H100"
    assert [g.index for g in node.gpus] == [0, 1, 2, 3]
    assert node.gpus[2].uuid == "GPU-00000002"
    assert node.gpus[0].memory_mb == 80 * 1024
    assert (node.rack, node.block, node.labels) == ("r7", "b1", {"zone": "z"})
    assert driver.shut_down


def test_a_host_whose_gpus_nvlink_joins_pair_by_pair_is_one_nvlink_domain() -> None:
    node = nvml_node(node_id="host-a", rack="r0", block="b0", nvml=FakeDriver(count=8))
    assert node is not None and node.nvlink


def test_gpus_on_pcie_or_bridged_only_in_pairs_make_no_nvlink_domain() -> None:
    pairs = {frozenset((0, 1)), frozenset((2, 3))}
    bridged = nvml_node(rack="r0", block="b0", nvml=FakeDriver(count=4, nvlink=pairs))
    pcie = nvml_node(rack="r0", block="b0", nvml=FakeDriver(count=4, nvlink=set()))

    assert bridged is not None and not bridged.nvlink
    assert pcie is not None and not pcie.nvlink


class NoP2PQuery(FakeDriver):
    """A driver that cannot say (NVML_ERROR_NOT_SUPPORTED), as on a lone PCIe H100."""

    def nvmlDeviceGetP2PStatus(self, first: int, other: int, caps: int) -> int:
        raise NoDriver.NVMLError("Not Supported")


def test_a_driver_that_cannot_tell_about_nvlink_makes_no_nvlink_domain() -> None:
    node = nvml_node(rack="r0", block="b0", nvml=NoP2PQuery(count=2))
    assert node is not None and not node.nvlink


def test_a_host_of_one_gpu_asks_nothing_about_nvlink() -> None:
    node = nvml_node(rack="r0", block="b0", nvml=NoP2PQuery(count=1))
    assert node is not None and node.nvlink


class LostGpus(FakeDriver):
    """GPUs `lost` fell off the bus: NVML answers GPU_IS_LOST for them."""

    def __init__(self, count: int, lost: set[int]) -> None:
        super().__init__(count)
        self.lost = lost

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        if index in self.lost:
            raise NoDriver.NVMLError("GPU is lost")
        return index


def test_a_gpu_lost_before_discovery_keeps_its_place_and_the_host_is_still_a_node() -> None:
    node = nvml_node(node_id="host-a", rack="r0", block="b0", nvml=LostGpus(4, lost={2}))
    assert node is not None
    assert [(g.index, g.uuid, g.memory_mb) for g in node.gpus] == [
        (0, "GPU-00000000", 80 * 1024),
        (1, "GPU-00000001", 80 * 1024),
        (2, "GPU-lost-2", 0),
        (3, "GPU-00000003", 80 * 1024),
    ]


def test_a_host_whose_every_gpu_is_lost_is_an_error_not_the_spec_s_fleet() -> None:
    with pytest.raises(RuntimeError, match="NVML lists 2 GPUs on this host and none can be read"):
        discover("16x8", mode="auto", nvml=LostGpus(2, lost={0, 1}))


def test_a_host_whose_driver_sees_no_gpu_is_not_a_node() -> None:
    assert nvml_node(rack="r0", block="b0", nvml=FakeDriver(count=0)) is None


def test_forcing_nvml_without_a_driver_is_an_error() -> None:
    with pytest.raises(RuntimeError, match="no NVIDIA driver"):
        discover("2x8", mode="nvml", nvml=NoDriver())


def test_auto_discovery_prefers_the_driver_over_the_spec() -> None:
    nodes = discover("2x8", mode="auto", node_id="host-a", nvml=FakeDriver(count=8))
    assert [(n.node_id, n.discovered_by, len(n.gpus)) for n in nodes] == [("host-a", "nvml", 8)]


@pytest.mark.parametrize(
    ("product", "gpu_type"),
    [("NVIDIA H100 80GB HBM3", "H100"), ("NVIDIA A100-SXM4-80GB", "A100"), ("Tesla V100", "V100")],
)
def test_the_gpu_type_is_the_product_family(product: str, gpu_type: str) -> None:
    assert gpu_type_of(product) == gpu_type


def test_an_identical_registration_is_not_appended_again() -> None:
    nodes = load_cluster_spec("3x8")
    latest: dict[str, NodeRegistered] = {n.node_id: n for n in nodes[:2]}
    assert registrations_to_append(nodes, latest) == [nodes[2]]


def test_a_changed_node_is_registered_again() -> None:
    before = load_cluster_spec("1x8")[0]
    after = before.model_copy(update={"labels": {"pool": "new"}})
    assert registrations_to_append([after], {before.node_id: before}) == [after]


def test_nvml_discovery_reports_the_hosts_cpus_and_memory_from_the_os() -> None:
    """CPUs and memory are scheduled resources (DESIGN §8): an NVML host declares what the OS
    says it has."""
    node = nvml_node(node_id="host-a", rack="r0", block="b0", nvml=FakeDriver(count=2))
    assert node is not None
    assert node.cpus == os.cpu_count()
    pages = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert node.memory_mb == pages // (1024 * 1024)
