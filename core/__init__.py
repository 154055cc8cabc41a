"""Gangway's scheduling core: a pure library, no I/O, no clock, no randomness it does not receive.

state = SchedulerState(SchedulingPolicy())
state.apply(event, at)            # fold every recorded event
result = schedule(state, now)     # decide; the caller records and folds result.decisions

A long-running caller holds a `Planner` (what one cycle keeps for the next: the placement
index, the quiet memo) and calls `planner.schedule(state, now)`.
"""

from core.audit import Auditor, Violation
from core.cycle import CycleResult, Planner, schedule
from core.policy import DEFAULT_PRIORITY_CLASSES, PriorityClass, SchedulingPolicy
from core.state import JobStatus, NodeView, SchedulerState
from core.topology import ClusterSpecError, parse_cluster_spec

__all__ = [
    "DEFAULT_PRIORITY_CLASSES",
    "Auditor",
    "ClusterSpecError",
    "CycleResult",
    "JobStatus",
    "NodeView",
    "Planner",
    "PriorityClass",
    "SchedulerState",
    "SchedulingPolicy",
    "Violation",
    "parse_cluster_spec",
    "schedule",
]
