"""The health service records a fact once, even across restarts (it reads the log first)."""

from __future__ import annotations

from schemas.nodes import (
    GpuRecovered,
    GpuUnhealthy,
    NodeDegraded,
    NodeDrainRequested,
    NodeUndrained,
)
from services.health.facts import HealthFacts


def unhealthy(gpu: int = 3) -> GpuUnhealthy:
    return GpuUnhealthy(node_id="n1", gpu_index=gpu, reason="XID 79")


def drain() -> NodeDrainRequested:
    return NodeDrainRequested(node_id="n1", reason="XID 79", by="health")


def test_a_gpu_failure_already_in_the_log_is_not_new() -> None:
    facts = HealthFacts()
    facts.fold(unhealthy())
    assert not facts.is_new(unhealthy())
    assert facts.is_new(unhealthy(gpu=4))


def test_a_recovered_gpu_can_fail_again() -> None:
    facts = HealthFacts()
    facts.fold(unhealthy())
    facts.fold(NodeDegraded(node_id="n1", signal="xid", detail="XID 79", gpu_index=3))
    facts.fold(GpuRecovered(node_id="n1", gpu_index=3))
    assert facts.is_new(unhealthy())
    assert facts.is_new(NodeDegraded(node_id="n1", signal="xid", detail="XID 79", gpu_index=3))


def test_a_drain_is_requested_once_until_the_node_is_undrained() -> None:
    facts = HealthFacts()
    facts.fold(drain())
    assert not facts.is_new(drain())
    facts.fold(NodeUndrained(node_id="n1", by="operator"))
    assert facts.is_new(drain())
