"""Checkpoint intervals that follow the failure rate: `checkpoint: {interval_s: auto}`.

The Young-Daly interval sqrt(2 C / lambda) minimises checkpoint writing plus rework for a job
whose checkpoint takes C seconds and whose gang fails at rate lambda (first order: every
interval costs C to write, every failure loses half an interval). It is the one definition:
the simulator's adaptive intervals use it too.

For a live job both come from the log, folded like the state (`CheckpointKnowledge`), so the
interval a gang was given can be recomputed by anyone replaying it:

- C: the measured cost of the job's own checkpoints, from each request (CheckpointRequested,
  or the PreemptionRequested that implies one) to its CheckpointCommitted; before the job
  has any, the cluster's recent checkpoints; before any at all, `PRIOR_CHECKPOINT_COST_S`;
- lambda: the failures per node-second seen on nodes of the gang's GPU type (NodeLost and
  GpuUnhealthy over the time those nodes were up), with a prior of one failure per
  `PRIOR_NODE_MTBF_H` node-hours that the observations outweigh as they accumulate; a gang on
  n nodes fails n times as often.

The interval chosen is recorded in the gang's GangReserved (`checkpoint_interval_s`), which
the agent passes to every rank (GANGWAY_CHECKPOINT_INTERVAL_S) and the checkpoint service
requests checkpoints by.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from schemas.base import Event
from schemas.checkpoints import (
    CheckpointCommitted,
    CheckpointCorrupted,
    CheckpointFailed,
    CheckpointRequested,
)
from schemas.jobs import JobSpec, PreemptionRequested
from schemas.nodes import GpuUnhealthy, NodeLost, NodeRecovered, NodeRegistered

HOUR_S = 3600.0
# What a checkpoint is assumed to cost before any was measured.
PRIOR_CHECKPOINT_COST_S = 60.0
# The failure rate assumed before any was observed: one per this many node-hours, weighing as
# much as that many node-hours of observation.
PRIOR_NODE_MTBF_H = 1000.0
# Costs kept per job and for the cluster.
COST_WINDOW = 8
CLUSTER_COST_WINDOW = 64
# Bounds on an automatic interval: more often stops the world for little; less often than
# daily is no periodic checkpoint to speak of.
MIN_AUTO_INTERVAL_S = 60.0
MAX_AUTO_INTERVAL_S = 24 * HOUR_S
# The checkpoint service's floor under a declared interval (the default of its
# `checkpoint_min_interval_s`, services/checkpoint/settings.py, defined here): a job asking for
# checkpoints more often gets them this often, so its last one may be this long ago.
SERVICE_MIN_INTERVAL_S = 60.0
_FOLDED: frozenset[type[Event]] = frozenset(
    {
        CheckpointRequested,
        PreemptionRequested,
        CheckpointCommitted,
        CheckpointFailed,
        CheckpointCorrupted,
        NodeRegistered,
        NodeRecovered,
        NodeLost,
        GpuUnhealthy,
    }
)


def young_daly_interval(checkpoint_cost_s: float, failure_rate: float) -> float:
    """sqrt(2 C MTBF); infinite (never checkpoint periodically) when nothing can fail."""
    if failure_rate <= 0:
        return math.inf
    return math.sqrt(2.0 * checkpoint_cost_s / failure_rate)


def is_auto(spec: JobSpec) -> bool:
    return spec.checkpoint.interval_s == "auto"


@dataclass(slots=True)
class _Exposure:
    """Nodes of one GPU type: how many are up, and the node-seconds and failures so far."""

    up: int = 0
    since: float = 0.0
    node_s: float = 0.0
    failures: int = 0

    def advance(self, at: float) -> None:
        if at > self.since:
            self.node_s += self.up * (at - self.since)
            self.since = at


@dataclass(slots=True)
class CheckpointKnowledge:
    """Checkpoint costs and failure rates, folded from events: `apply(event, at)`, then ask."""

    _requested: dict[str, float] = field(default_factory=dict)
    _costs: dict[str, deque[float]] = field(default_factory=dict)
    _cluster_costs: deque[float] = field(default_factory=lambda: deque(maxlen=CLUSTER_COST_WINDOW))
    _types: dict[str, _Exposure] = field(default_factory=dict)
    # node id → (GPU type, up)
    _nodes: dict[str, tuple[str, bool]] = field(default_factory=dict)

    def apply(self, event: Event, at: float) -> None:
        kind = type(event)
        if kind not in _FOLDED:
            return  # most of a log: one set lookup
        if kind is CheckpointRequested or kind is PreemptionRequested:
            job_id = str(getattr(event, "job_id", ""))
            # The first request stands while it is outstanding (a preemption during a periodic
            # checkpoint is served by the checkpoint already being written).
            self._requested.setdefault(job_id, at)
        elif kind is CheckpointCommitted:
            assert isinstance(event, CheckpointCommitted)
            started = self._requested.pop(event.job_id, None)
            if started is not None:
                cost = max(0.0, at - started)
                costs = self._costs.get(event.job_id)
                if costs is None:
                    costs = self._costs[event.job_id] = deque(maxlen=COST_WINDOW)
                costs.append(cost)
                self._cluster_costs.append(cost)
        elif kind is CheckpointFailed or kind is CheckpointCorrupted:
            assert isinstance(event, CheckpointFailed | CheckpointCorrupted)
            self._requested.pop(event.job_id, None)
        elif kind is NodeRegistered:
            assert isinstance(event, NodeRegistered)
            known = self._nodes.get(event.node_id)
            if known is not None and known[1]:
                if known[0] == event.gpu_type:
                    return
                self._set_up(event.node_id, known[0], False, at)
            self._set_up(event.node_id, event.gpu_type, True, at)
        elif kind is NodeRecovered:
            assert isinstance(event, NodeRecovered)
            known = self._nodes.get(event.node_id)
            if known is not None and not known[1]:
                self._set_up(event.node_id, known[0], True, at)
        elif kind is NodeLost:
            assert isinstance(event, NodeLost)
            known = self._nodes.get(event.node_id)
            if known is not None and known[1]:
                self._failed(known[0], at)
                self._set_up(event.node_id, known[0], False, at)
        elif kind is GpuUnhealthy:
            assert isinstance(event, GpuUnhealthy)
            known = self._nodes.get(event.node_id)
            if known is not None:
                self._failed(known[0], at)

    def _exposure(self, gpu_type: str, at: float) -> _Exposure:
        found = self._types.get(gpu_type)
        if found is None:
            found = self._types[gpu_type] = _Exposure(since=at)
        found.advance(at)
        return found

    def _set_up(self, node_id: str, gpu_type: str, up: bool, at: float) -> None:
        exposure = self._exposure(gpu_type, at)
        exposure.up += 1 if up else -1
        self._nodes[node_id] = (gpu_type, up)

    def _failed(self, gpu_type: str, at: float) -> None:
        self._exposure(gpu_type, at).failures += 1

    # ---------------------------------------------------------------- ask

    def checkpoint_cost_s(self, job_id: str) -> float:
        """What a checkpoint of the job costs: the mean of its own measured ones, else of the
        cluster's recent ones, else the prior."""
        costs = self._costs.get(job_id) or self._cluster_costs
        if not costs:
            return PRIOR_CHECKPOINT_COST_S
        return sum(costs) / len(costs)

    def node_failure_rate(self, gpu_type: str, now: float) -> float:
        """Failures per node-second of a node of this GPU type (the prior folded in)."""
        found = self._types.get(gpu_type)
        node_s, failures = 0.0, 0
        if found is not None:
            node_s = found.node_s + found.up * max(0.0, now - found.since)
            failures = found.failures
        return (failures + 1) / (node_s + PRIOR_NODE_MTBF_H * HOUR_S)

    def auto_interval_s(self, job_id: str, gpu_type: str, nodes: int, now: float) -> float:
        """The Young-Daly interval for a gang of the job on `nodes` nodes of `gpu_type`."""
        rate = self.node_failure_rate(gpu_type, now) * max(nodes, 1)
        interval = young_daly_interval(self.checkpoint_cost_s(job_id), rate)
        return round(min(MAX_AUTO_INTERVAL_S, max(MIN_AUTO_INTERVAL_S, interval)), 1)


def declared_interval_s(spec: JobSpec | None) -> float | None:
    """How often a gang with a declared (numeric) interval is checkpointed: the declared
    interval, but never more often than the checkpoint service's floor. None for no periodic
    checkpoints, and for `auto`, whose interval is chosen per gang."""
    interval = spec.checkpoint.interval_s if spec is not None else None
    if not isinstance(interval, int | float):
        return None
    return max(float(interval), SERVICE_MIN_INTERVAL_S)


def checkpoint_interval_s(
    knowledge: CheckpointKnowledge,
    job_id: str,
    spec: JobSpec,
    gpu_type: str,
    nodes: int,
    now: float,
) -> float | None:
    """The periodic checkpoint interval of a gang about to start: the spec's, Young-Daly's for
    `auto`, or None (no periodic checkpoints)."""
    interval = spec.checkpoint.interval_s
    if interval == "auto":
        return knowledge.auto_interval_s(job_id, gpu_type, nodes, now)
    return interval
