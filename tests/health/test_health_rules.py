"""Health rules: which telemetry makes a GPU unhealthy, a node degraded, a node drained."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from schemas.nodes import (
    GpuRecovered,
    GpuUnhealthy,
    NodeDegraded,
    NodeDrainRequested,
    NodeUndrained,
    StragglerDetected,
)
from schemas.telemetry import GpuSample, NodeHeartbeat, StepTimeSample
from services.health.rules import HealthMonitor, HealthThresholds

AT = datetime(2026, 11, 21, tzinfo=UTC)


def heartbeat(*gpus: GpuSample, nic: float | None = None, node: str = "n0") -> NodeHeartbeat:
    return NodeHeartbeat(node_id=node, at=AT, gpus=list(gpus), nic_gbps=nic, nic_expected_gbps=400)


def gpu(index: int = 0, **fields: Any) -> GpuSample:
    return GpuSample(index=index, temperature_c=60, **fields)


def types(events: list[Any]) -> list[str]:
    return [event.type for event in events]


def test_a_healthy_heartbeat_records_nothing() -> None:
    assert HealthMonitor().observe_heartbeat(heartbeat(gpu(0), gpu(1), nic=400)) == []


def test_an_uncorrected_ecc_error_makes_the_gpu_unhealthy_once() -> None:
    monitor = HealthMonitor()
    first = monitor.observe_heartbeat(heartbeat(gpu(3, ecc_uncorrected=2)))
    again = monitor.observe_heartbeat(heartbeat(gpu(3, ecc_uncorrected=2)))
    assert types(first) == ["GpuUnhealthy", "NodeDegraded"]
    assert isinstance(first[0], GpuUnhealthy) and first[0].gpu_index == 3
    assert again == []


def test_a_gpu_fallen_off_the_bus_drains_its_node() -> None:
    events = HealthMonitor().observe_heartbeat(heartbeat(gpu(5, xid_errors=[79])))
    assert types(events) == ["GpuUnhealthy", "NodeDegraded", "NodeDrainRequested"]
    assert isinstance(events[2], NodeDrainRequested) and "XID 79" in events[2].reason


def test_an_application_xid_is_not_a_hardware_fault() -> None:
    # XID 13 (graphics engine exception) is usually the user's kernel, not the GPU.
    assert HealthMonitor().observe_heartbeat(heartbeat(gpu(0, xid_errors=[13]))) == []


def test_one_hot_sample_is_not_throttling() -> None:
    monitor = HealthMonitor(HealthThresholds(thermal_samples=3))
    hot = GpuSample(index=0, temperature_c=92)
    assert monitor.observe_heartbeat(heartbeat(hot)) == []
    assert monitor.observe_heartbeat(heartbeat(gpu(0))) == []
    assert monitor.observe_heartbeat(heartbeat(hot)) == []


def test_a_gpu_hot_for_consecutive_samples_degrades_the_node() -> None:
    monitor = HealthMonitor(HealthThresholds(thermal_samples=3))
    hot = GpuSample(index=0, temperature_c=92)
    events = [monitor.observe_heartbeat(heartbeat(hot)) for _ in range(3)]
    assert events[:2] == [[], []]
    assert types(events[2]) == ["NodeDegraded"]
    assert isinstance(events[2][0], NodeDegraded) and events[2][0].signal == "thermal"


def test_several_hot_gpus_drain_the_node() -> None:
    monitor = HealthMonitor(HealthThresholds(thermal_samples=1, thermal_drain_gpus=2))
    hot = [GpuSample(index=i, temperature_c=95) for i in range(2)]
    assert types(monitor.observe_heartbeat(heartbeat(*hot))) == [
        "NodeDegraded",
        "NodeDrainRequested",
    ]


def test_a_nic_below_its_rate_for_consecutive_samples_drains_the_node() -> None:
    monitor = HealthMonitor(HealthThresholds(nic_samples=2))
    assert monitor.observe_heartbeat(heartbeat(gpu(), nic=100)) == []
    events = monitor.observe_heartbeat(heartbeat(gpu(), nic=100))
    assert types(events) == ["NodeDegraded", "NodeDrainRequested"]
    assert "100 of 400 Gb/s" in events[0].detail  # type: ignore[attr-defined]


def test_a_drain_is_requested_only_once_per_node() -> None:
    monitor = HealthMonitor(HealthThresholds(nic_samples=1))
    monitor.observe_heartbeat(heartbeat(gpu(0, xid_errors=[79]), nic=10))
    assert monitor.observe_heartbeat(heartbeat(gpu(1, xid_errors=[79]), nic=10)) == [
        GpuUnhealthy(node_id="n0", gpu_index=1, reason="XID 79"),
        NodeDegraded(node_id="n0", signal="xid", detail="XID 79", gpu_index=1),
    ]


def test_a_returned_node_is_judged_afresh() -> None:
    monitor = HealthMonitor()
    monitor.observe_heartbeat(heartbeat(gpu(0, xid_errors=[79])))
    monitor.forget_node_drain("n0")
    assert "NodeDrainRequested" in types(
        monitor.observe_heartbeat(heartbeat(gpu(0, xid_errors=[79])))
    )


def step(rank: int, seconds: float, node: str = "n0", step_no: int = 0) -> StepTimeSample:
    return StepTimeSample(
        job_id="j1", attempt=1, rank=rank, node_id=node, step=step_no, step_time_s=seconds, at=AT
    )


def test_a_rank_persistently_slower_than_its_gang_is_a_straggler() -> None:
    monitor = HealthMonitor(HealthThresholds(straggler_samples=3))
    events = []
    for step_no in range(4):
        for rank in range(4):
            node = "n-slow" if rank == 2 else "n0"
            events += monitor.observe_step_time(
                step(rank, 2.0 if rank == 2 else 1.0, node, step_no)
            )
    stragglers = [event for event in events if isinstance(event, StragglerDetected)]
    assert len(stragglers) == 1
    assert (stragglers[0].node_id, stragglers[0].rank) == ("n-slow", 2)
    assert "NodeDegraded" in types(events)


def test_a_single_slow_step_is_no_straggler() -> None:
    monitor = HealthMonitor(HealthThresholds(straggler_samples=3))
    events = []
    for step_no in range(5):
        for rank in range(4):
            slow = rank == 1 and step_no == 2
            events += monitor.observe_step_time(step(rank, 3.0 if slow else 1.0, step_no=step_no))
    assert events == []


def test_a_gpu_healthy_for_a_streak_recovers_and_its_node_returns_to_service() -> None:
    monitor = HealthMonitor(HealthThresholds(recovery_samples=3))
    monitor.observe_heartbeat(heartbeat(gpu(5, xid_errors=[79]), gpu(6)))
    healthy = heartbeat(gpu(5), gpu(6))
    assert monitor.observe_heartbeat(healthy) == []
    assert monitor.observe_heartbeat(healthy) == []
    assert monitor.observe_heartbeat(healthy) == [
        GpuRecovered(node_id="n0", gpu_index=5),
        NodeUndrained(node_id="n0", by="health"),
    ]
    assert monitor.observe_heartbeat(healthy) == []


def test_a_fault_seen_again_restarts_the_recovery_streak() -> None:
    monitor = HealthMonitor(HealthThresholds(recovery_samples=2))
    monitor.observe_heartbeat(heartbeat(gpu(0, ecc_uncorrected=1)))
    monitor.observe_heartbeat(heartbeat(gpu(0)))
    monitor.observe_heartbeat(heartbeat(gpu(0, ecc_uncorrected=1)))
    assert monitor.observe_heartbeat(heartbeat(gpu(0))) == []
    assert types(monitor.observe_heartbeat(heartbeat(gpu(0)))) == ["GpuRecovered"]


def test_a_node_an_operator_drained_stays_drained_when_healthy() -> None:
    monitor = HealthMonitor(HealthThresholds(recovery_samples=1))
    monitor.observe_heartbeat(heartbeat(gpu(0, xid_errors=[79])))
    monitor.note(NodeDrainRequested(node_id="n0", reason="bad cable", by="admin"))
    assert types(monitor.observe_heartbeat(heartbeat(gpu(0)))) == ["GpuRecovered"]
    assert monitor.observe_heartbeat(heartbeat(gpu(0))) == []


def test_a_restarted_monitor_recovers_what_the_log_says_is_unhealthy() -> None:
    monitor = HealthMonitor(HealthThresholds(recovery_samples=1))
    monitor.note(GpuUnhealthy(node_id="n0", gpu_index=2, reason="XID 79"))
    monitor.note(NodeDrainRequested(node_id="n0", reason="GPU 2: XID 79", by="health"))
    assert types(monitor.observe_heartbeat(heartbeat(gpu(2)))) == ["GpuRecovered", "NodeUndrained"]
