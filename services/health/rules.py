"""Health rules: from raw telemetry to the few facts worth recording.

Pure and incremental: a monitor folds heartbeats and step-time samples and returns events only
when a node's or GPU's condition changes, so the log records transitions, never samples.
"""

from __future__ import annotations

import statistics
from collections import defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from schemas.base import Event
from schemas.nodes import (
    GpuRecovered,
    GpuUnhealthy,
    NodeDegraded,
    NodeDrainRequested,
    NodeUndrained,
    StragglerDetected,
)
from schemas.telemetry import NodeHeartbeat, StepTimeSample

# XIDs that mean the GPU cannot be trusted with work until someone looks at it:
# 48 double-bit ECC, 63/64 row remapping, 74 NVLink, 79 fallen off the bus, 92 high single-bit
# ECC rate, 94/95 contained/uncontained ECC, 119/120 GSP firmware.
FATAL_XIDS = frozenset({48, 63, 64, 74, 79, 92, 94, 95, 119, 120})
# Of those, the ones that take the whole node's NVLink fabric or bus down with them.
NODE_FATAL_XIDS = frozenset({74, 79})

HEALTH_PRODUCER = "health"


@dataclass(frozen=True, slots=True)
class HealthThresholds:
    gpu_temperature_c: float = 87.0
    thermal_samples: int = 3  # consecutive hot heartbeats before a GPU counts as throttling
    thermal_drain_gpus: int = 2  # hot GPUs on one node that make the node worth draining
    nic_ratio: float = 0.8  # below this share of the expected link rate the NIC is degraded
    nic_samples: int = 3
    straggler_ratio: float = 1.5  # step time over the gang's median that marks a straggler
    straggler_samples: int = 5  # consecutive slow steps before a rank is called a straggler
    straggler_window: int = 20  # recent steps per rank kept for the gang's median
    # Consecutive healthy heartbeats before an unhealthy GPU is trusted again (GpuRecovered),
    # and before a node drained for its health is returned to service (NodeUndrained).
    recovery_samples: int = 10


@dataclass
class _NodeCondition:
    hot_streak: dict[int, int] = field(default_factory=lambda: defaultdict(int))
    hot_gpus: set[int] = field(default_factory=set)
    unhealthy_gpus: set[int] = field(default_factory=set)
    slow_nic_streak: int = 0
    degraded: set[str] = field(default_factory=set)
    drain_requested: bool = False
    # Healthy heartbeats in a row, per unhealthy GPU and for the whole node.
    healthy_streak: dict[int, int] = field(default_factory=lambda: defaultdict(int))
    clear_streak: int = 0
    # An operator drained the node: it stays drained until an operator undrains it.
    operator_hold: bool = False


@dataclass
class _RankPace:
    node_id: str
    recent: deque[float]
    slow_streak: int = 0
    flagged: bool = False


class HealthMonitor:
    def __init__(self, thresholds: HealthThresholds = HealthThresholds()) -> None:
        self.thresholds = thresholds
        self._nodes: dict[str, _NodeCondition] = defaultdict(_NodeCondition)
        self._gangs: dict[tuple[str, int], dict[int, _RankPace]] = defaultdict(dict)

    def forget_node_drain(self, node_id: str) -> None:
        """An operator returned the node to service: judge it afresh from now on."""
        self._nodes.pop(node_id, None)

    def note(self, event: Event) -> None:
        """Learn from the log what this monitor did not see itself (a restart, an operator):
        GPUs already unhealthy, drains already requested and by whom, nodes returned."""
        learn = _NOTES.get(type(event))
        if learn is not None:
            learn(self, event)

    def _note_gpu_unhealthy(self, event: GpuUnhealthy) -> None:
        self._nodes[event.node_id].unhealthy_gpus.add(event.gpu_index)

    def _note_gpu_recovered(self, event: GpuRecovered) -> None:
        self._nodes[event.node_id].unhealthy_gpus.discard(event.gpu_index)

    def _note_drain_requested(self, event: NodeDrainRequested) -> None:
        condition = self._nodes[event.node_id]
        condition.drain_requested = True
        if event.by != HEALTH_PRODUCER:
            condition.operator_hold = True

    def _note_undrained(self, event: NodeUndrained) -> None:
        self.forget_node_drain(event.node_id)

    def observe_heartbeat(self, heartbeat: NodeHeartbeat) -> list[Event]:
        limits = self.thresholds
        node_id = heartbeat.node_id
        condition = self._nodes[node_id]
        events: list[Event] = []
        drain_reasons: list[str] = []

        for gpu in heartbeat.gpus:
            fatal = sorted(FATAL_XIDS.intersection(gpu.xid_errors))
            reason = None
            if gpu.ecc_uncorrected > 0:
                reason = f"{gpu.ecc_uncorrected} uncorrected ECC errors"
            elif fatal:
                reason = f"XID {', '.join(map(str, fatal))}"
            if reason is not None and gpu.index not in condition.unhealthy_gpus:
                condition.unhealthy_gpus.add(gpu.index)
                events.append(GpuUnhealthy(node_id=node_id, gpu_index=gpu.index, reason=reason))
                signal = "ecc" if gpu.ecc_uncorrected > 0 else "xid"
                events.append(
                    NodeDegraded(node_id=node_id, signal=signal, detail=reason, gpu_index=gpu.index)
                )
                condition.degraded.add(signal)
                if NODE_FATAL_XIDS.intersection(gpu.xid_errors):
                    drain_reasons.append(f"GPU {gpu.index}: {reason}")

            hot = gpu.temperature_c is not None and gpu.temperature_c >= limits.gpu_temperature_c
            condition.hot_streak[gpu.index] = condition.hot_streak[gpu.index] + 1 if hot else 0
            if condition.hot_streak[gpu.index] >= limits.thermal_samples:
                condition.hot_gpus.add(gpu.index)
            elif not hot:
                condition.hot_gpus.discard(gpu.index)

        if len(condition.hot_gpus) >= 1 and "thermal" not in condition.degraded:
            condition.degraded.add("thermal")
            gpus = ", ".join(map(str, sorted(condition.hot_gpus)))
            events.append(
                NodeDegraded(
                    node_id=node_id,
                    signal="thermal",
                    detail=f"GPU {gpus} at or above {limits.gpu_temperature_c:g} C",
                )
            )
        if len(condition.hot_gpus) >= limits.thermal_drain_gpus:
            drain_reasons.append(f"{len(condition.hot_gpus)} GPUs running hot")

        expected = heartbeat.nic_expected_gbps
        if heartbeat.nic_gbps is not None and expected:
            slow = heartbeat.nic_gbps < limits.nic_ratio * expected
            condition.slow_nic_streak = condition.slow_nic_streak + 1 if slow else 0
            if condition.slow_nic_streak >= limits.nic_samples and "nic" not in condition.degraded:
                condition.degraded.add("nic")
                detail = f"NIC at {heartbeat.nic_gbps:g} of {expected:g} Gb/s"
                events.append(NodeDegraded(node_id=node_id, signal="nic", detail=detail))
                drain_reasons.append(detail)

        if drain_reasons and not condition.drain_requested:
            condition.drain_requested = True
            events.append(
                NodeDrainRequested(node_id=node_id, reason="; ".join(drain_reasons), by="health")
            )
        events += self._recoveries(heartbeat, condition)
        return events

    def _recoveries(self, heartbeat: NodeHeartbeat, condition: _NodeCondition) -> list[Event]:
        """GPUs healthy again for a streak, then the node itself once every fault cleared."""
        limits = self.thresholds
        node_id = heartbeat.node_id
        events: list[Event] = []
        any_fault = False
        for gpu in heartbeat.gpus:
            faulty = gpu.ecc_uncorrected > 0 or bool(FATAL_XIDS.intersection(gpu.xid_errors))
            any_fault = any_fault or faulty
            if gpu.index not in condition.unhealthy_gpus:
                continue
            streak = 0 if faulty else condition.healthy_streak[gpu.index] + 1
            condition.healthy_streak[gpu.index] = streak
            if streak >= limits.recovery_samples:
                condition.unhealthy_gpus.discard(gpu.index)
                del condition.healthy_streak[gpu.index]
                events.append(GpuRecovered(node_id=node_id, gpu_index=gpu.index))
        clear = not any_fault and not condition.hot_gpus and condition.slow_nic_streak == 0
        condition.clear_streak = condition.clear_streak + 1 if clear else 0
        if (
            condition.drain_requested
            and not condition.operator_hold
            and not condition.unhealthy_gpus
            and condition.clear_streak >= limits.recovery_samples
        ):
            self.forget_node_drain(node_id)
            events.append(NodeUndrained(node_id=node_id, by=HEALTH_PRODUCER))
        return events

    def observe_step_time(self, sample: StepTimeSample) -> list[Event]:
        """Flag a rank whose steps stay well behind its gang's median."""
        limits = self.thresholds
        gang = self._gangs[(sample.job_id, sample.attempt)]
        pace = gang.get(sample.rank)
        if pace is None:
            pace = gang[sample.rank] = _RankPace(
                sample.node_id, deque(maxlen=limits.straggler_window)
            )
        pace.recent.append(sample.step_time_s)
        if len(gang) < 2:
            return []
        median = statistics.median(
            statistics.median(other.recent) for other in gang.values() if other.recent
        )
        slow = sample.step_time_s > limits.straggler_ratio * median
        pace.slow_streak = pace.slow_streak + 1 if slow else 0
        if pace.slow_streak < limits.straggler_samples or pace.flagged:
            return []
        pace.flagged = True
        condition = self._nodes[sample.node_id]
        events: list[Event] = [
            StragglerDetected(
                node_id=sample.node_id,
                job_id=sample.job_id,
                rank=sample.rank,
                step_time_s=sample.step_time_s,
                median_step_time_s=median,
            )
        ]
        if "straggler" not in condition.degraded:
            condition.degraded.add("straggler")
            events.append(
                NodeDegraded(
                    node_id=sample.node_id,
                    signal="straggler",
                    detail=f"rank {sample.rank} of job {sample.job_id} steps in "
                    f"{sample.step_time_s:.2f}s against a median of {median:.2f}s",
                )
            )
        return events

    def forget_gang(self, job_id: str, attempt: int) -> None:
        self._gangs.pop((job_id, attempt), None)


# What the monitor learns from each recorded fact, in one table (the house's dispatch style).
_NOTES: dict[type[Event], Callable[[HealthMonitor, Any], None]] = {
    GpuUnhealthy: HealthMonitor._note_gpu_unhealthy,
    GpuRecovered: HealthMonitor._note_gpu_recovered,
    NodeDrainRequested: HealthMonitor._note_drain_requested,
    NodeUndrained: HealthMonitor._note_undrained,
}
