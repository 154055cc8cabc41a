"""Gangway's scheduling core: a pure library, no I/O, no clock, no randomness it does not receive.

state = SchedulerState(SchedulingPolicy())
state.apply(event, at)            # fold every recorded event
result = schedule(state, now)     # decide; the caller records and folds result.decisions
"""

from core.audit import Auditor, Violation
from core.cycle import CycleResult, schedule
from core.policy import DEFAULT_PRIORITY_CLASSES, PriorityClass, SchedulingPolicy
from core.state import JobView, NodeView, SchedulerState
from core.topology import ClusterSpecError, parse_cluster_spec

__all__ = [
    "DEFAULT_PRIORITY_CLASSES",
    "Auditor",
    "ClusterSpecError",
    "CycleResult",
    "JobView",
    "NodeView",
    "PriorityClass",
    "SchedulerState",
    "SchedulingPolicy",
    "Violation",
    "parse_cluster_spec",
    "schedule",
]
