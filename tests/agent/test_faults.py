"""Fault injection on simulated nodes, and the heartbeats it shapes."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from services.agent.faults import HEALTHY, FaultReader, heal, inject, parse_fault
from services.agent.heartbeats import synthetic_heartbeat
from services.health.rules import HealthMonitor
from services.runtime.discovery import load_cluster_spec

NODE = load_cluster_spec("1x8")[0]
NOW = datetime(2026, 11, 22, tzinfo=UTC)


def test_a_healthy_simulated_node_looks_healthy_to_the_health_rules() -> None:
    heartbeat = synthetic_heartbeat(NODE, NOW, busy={0, 1})
    assert len(heartbeat.gpus) == 8
    # SM activity as GPM would report it: some for the busy GPUs, none for the idle ones.
    assert [g.sm_activity for g in heartbeat.gpus[:3]] == [70.0, 70.0, 0.0]
    assert HealthMonitor().observe_heartbeat(heartbeat) == []


def test_an_injected_xid_79_drains_the_node() -> None:
    fault = parse_fault('{"gpus": {"3": {"xid_errors": [79]}}}')
    heartbeat = synthetic_heartbeat(NODE, NOW, fault)
    assert heartbeat.gpus[3].xid_errors == [79]
    types = [e.type for e in HealthMonitor().observe_heartbeat(heartbeat)]
    assert types == ["GpuUnhealthy", "NodeDegraded", "NodeDrainRequested"]


def test_the_reader_sees_injected_faults_until_healed(tmp_path: Path) -> None:
    reader = FaultReader(tmp_path / "faults")
    assert reader.current() == {}
    inject(tmp_path / "faults", "n0000", {"silent": True})
    assert reader.current()["n0000"].silent
    heal(tmp_path / "faults", "n0000")
    assert reader.current() == {}


def test_a_malformed_fault_file_is_ignored(tmp_path: Path) -> None:
    (tmp_path / "n0001.json").write_text("{not json")
    (tmp_path / "n0002.json").write_text('{"explode": true}')
    inject(tmp_path, "n0003", {"nic_gbps": 10})
    assert list(FaultReader(tmp_path).current()) == ["n0003"]


@pytest.mark.parametrize(
    "text",
    [
        "[1, 2]",
        '{"gpus": {"0": {"voltage": 3}}}',
        '{"gpus": [1]}',
        # Readings no GPU reports (attack5: `"xid_errors": 79`, a list's brackets forgotten,
        # failed every heartbeat round, and the whole fleet fell silent).
        '{"gpus": {"3": {"xid_errors": 79}}}',
        '{"gpus": {"3": {"xid_errors": ["x"]}}}',
        '{"gpus": {"0": {"temperature_c": "hot"}}}',
        '{"gpus": {"0": {"utilization": 300}}}',
        '{"nic_gbps": -5}',
        '{"silent": "no"}',
    ],
)
def test_a_fault_that_is_not_one_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        parse_fault(text)


def test_a_fault_file_no_gpu_could_report_silences_no_node(tmp_path: Path) -> None:
    (tmp_path / "n0000.json").write_text('{"gpus": {"3": {"xid_errors": 79}}}')
    (tmp_path / "n0001.json").write_text('{"nic_gbps": -5}')
    faults = FaultReader(tmp_path).current()
    assert faults == {}
    heartbeat = synthetic_heartbeat(NODE, NOW, faults.get(NODE.node_id, HEALTHY))
    assert heartbeat.gpus[3].xid_errors == []
