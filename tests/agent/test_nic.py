"""A real host's network links in its heartbeats: each link against its own first rate, so that
health drains a node whose fabric link fell or went down, and never one for its 1 GbE management
port or an unused socket. The kernel's files are laid out in tmp_path as sysfs has them."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from schemas.nodes import NodeDegraded
from services.agent.faults import parse_fault
from services.agent.heartbeats import NvmlSampler
from services.agent.nic import FabricLinks, ib_rate_gbps, link_rates
from services.health.rules import HealthMonitor
from tests.agent.test_nvml_heartbeat import FakeDriver

NOW = datetime(2026, 11, 24, tzinfo=UTC)


def ib_port(root: Path, device: str, port: int, rate: str, state: str = "4: ACTIVE") -> None:
    path = root / "class" / "infiniband" / device / "ports" / str(port)
    path.mkdir(parents=True, exist_ok=True)
    (path / "rate").write_text(rate + "\n")
    (path / "state").write_text(state + "\n")


def interface(root: Path, name: str, speed: str, state: str = "up", physical: bool = True) -> None:
    path = root / "class" / "net" / name
    path.mkdir(parents=True, exist_ok=True)
    (path / "speed").write_text(speed + "\n")
    (path / "operstate").write_text(state + "\n")
    if physical:
        (path / "device").mkdir(exist_ok=True)


def test_an_infiniband_rate_is_read_as_the_kernel_words_it() -> None:
    assert ib_rate_gbps("400 Gb/sec (4X NDR)") == 400.0
    assert ib_rate_gbps("56.25 Gb/sec (4X FDR)") == 56.25
    assert ib_rate_gbps("unknown") is None


def test_infiniband_ports_are_the_fabric_where_a_host_has_them(tmp_path: Path) -> None:
    ib_port(tmp_path, "mlx5_0", 1, "400 Gb/sec (4X NDR)")
    ib_port(tmp_path, "mlx5_1", 1, "400 Gb/sec (4X NDR)", state="1: DOWN")
    interface(tmp_path, "eno1", "1000")
    assert link_rates(tmp_path) == {"mlx5_0/1": 400.0, "mlx5_1/1": 0.0}


def test_physical_ethernet_counts_and_virtual_or_unknown_rates_do_not(tmp_path: Path) -> None:
    interface(tmp_path, "eth0", "100000")
    interface(tmp_path, "eth1", "-1")  # a virtual NIC: the kernel knows no rate
    interface(tmp_path, "eth2", "25000", state="down")
    interface(tmp_path, "lo", "0", state="unknown", physical=False)
    assert link_rates(tmp_path) == {"eth0": 100.0, "eth2": 0.0}


def test_a_host_without_known_links_reports_none(tmp_path: Path) -> None:
    interface(tmp_path, "eth0", "-1")
    assert FabricLinks(tmp_path).read() == (None, None)


def test_each_link_is_held_to_its_first_rate_and_the_worst_is_reported(tmp_path: Path) -> None:
    interface(tmp_path, "eno1", "1000")  # management: slow, and always was
    interface(tmp_path, "ens1", "400000")
    interface(tmp_path, "ens2", "400000")
    interface(tmp_path, "ens3", "100000", state="down")  # never up: an unused socket
    links = FabricLinks(tmp_path)
    assert links.read() == (400.0, 400.0)  # every link at its rate: the fastest is shown
    interface(tmp_path, "ens2", "200000")
    assert links.read() == (200.0, 400.0)
    interface(tmp_path, "ens1", "400000", state="down")
    assert links.read() == (0.0, 400.0)


def test_health_drains_a_real_host_whose_fabric_link_fell_and_not_before(tmp_path: Path) -> None:
    interface(tmp_path, "eno1", "1000")
    interface(tmp_path, "ens1", "400000")
    sampler = NvmlSampler(FakeDriver(2), links=FabricLinks(tmp_path))
    monitor = HealthMonitor()
    for _ in range(5):
        assert monitor.observe_heartbeat(sampler.heartbeat("gpu-host", NOW)) == []
    interface(tmp_path, "ens1", "100000")
    events = [
        event
        for _ in range(5)
        for event in monitor.observe_heartbeat(sampler.heartbeat("gpu-host", NOW))
    ]
    degraded = [e for e in events if isinstance(e, NodeDegraded)]
    assert [(e.signal, e.detail) for e in degraded] == [("nic", "NIC at 100 of 400 Gb/s")]


def test_an_injected_nic_fault_overrides_a_real_host_s_reading(tmp_path: Path) -> None:
    sampler = NvmlSampler(FakeDriver(1), links=FabricLinks(tmp_path))  # no links known
    heartbeat = sampler.heartbeat("gpu-host", NOW, parse_fault('{"nic_gbps": 40}'))
    assert (heartbeat.nic_gbps, heartbeat.nic_expected_gbps) == (40.0, 400.0)


def test_odd_speeds_are_no_rate_and_a_link_reading_that_raises_costs_only_the_nic(
    tmp_path: Path,
) -> None:
    interface(tmp_path, "eth0", "²")  # digits int() refuses
    interface(tmp_path, "eth1", "-1000")
    assert link_rates(tmp_path) == {}

    class Broken(FabricLinks):
        def read(self) -> tuple[float | None, float | None]:
            raise OSError("sysfs gone")

    heartbeat = NvmlSampler(FakeDriver(2), links=Broken(tmp_path)).heartbeat("gpu-host", NOW)
    assert (heartbeat.nic_gbps, heartbeat.nic_expected_gbps) == (None, None)
    assert len(heartbeat.gpus) == 2
