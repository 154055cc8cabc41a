"""The figures of a simulation run, computed from per-job records (pure arithmetic, no core).

Definitions (also in docs/simulator.md):
- queue time: first start - submit (the wait before the job first ran; waits after a preemption
  are not included, they show in JCT);
- JCT: finish - submit, for completed jobs;
- makespan: last completion (a job's terminal moment) - first submit; the timers still pending
  after the last job ends (aging, estimated ends) are not part of it;
- GPU utilization: allocated GPU-seconds / (cluster GPUs x makespan).
Queue-time figures cover the jobs that started; JCT figures the jobs that completed.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(slots=True)
class SimJobMetrics:
    """What the simulator saw of one job; filled in as the run goes."""

    job_id: str
    tenant: str
    priority: str
    num_gpus: int
    submit_s: float
    first_start_s: float | None = None
    finish_s: float | None = None
    outcome: str | None = None  # "succeeded" | "failed" | "cancelled"; None while not terminal
    attempts: int = 0
    preemptions: int = 0

    @property
    def queue_s(self) -> float | None:
        return None if self.first_start_s is None else self.first_start_s - self.submit_s

    @property
    def jct_s(self) -> float | None:
        if self.finish_s is None or self.outcome != "succeeded":
            return None
        return self.finish_s - self.submit_s


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100) of sorted `values`, linearly interpolated (numpy's default)."""
    if not values:
        return 0.0
    position = (len(values) - 1) * q / 100.0
    low = math.floor(position)
    high = min(low + 1, len(values) - 1)
    return values[low] + (values[high] - values[low]) * (position - low)


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def group_figures(records: Iterable[SimJobMetrics]) -> dict[str, Any]:
    """jobs, completed, queue-time and JCT figures of a group of jobs."""
    jobs = 0
    queues: list[float] = []
    jcts: list[float] = []
    for record in records:
        jobs += 1
        if (queue := record.queue_s) is not None:
            queues.append(queue)
        if (jct := record.jct_s) is not None:
            jcts.append(jct)
    queues.sort()
    return {
        "jobs": jobs,
        "completed": len(jcts),
        "started": len(queues),
        "avg_queue_s": _mean(queues),
        "p50_queue_s": percentile(queues, 50),
        "p99_queue_s": percentile(queues, 99),
        "max_queue_s": queues[-1] if queues else 0.0,
        "avg_jct_s": _mean(jcts),
    }


def _grouped(
    records: Sequence[SimJobMetrics], key: Callable[[SimJobMetrics], str]
) -> dict[str, dict[str, Any]]:
    groups: dict[str, list[SimJobMetrics]] = {}
    for record in records:
        groups.setdefault(key(record), []).append(record)
    return {name: group_figures(groups[name]) for name in sorted(groups)}


def makespan_s(records: Iterable[SimJobMetrics]) -> float:
    """From the first submission to the last completion (0 when no job has completed)."""
    first: float | None = None
    last: float | None = None
    for record in records:
        first = record.submit_s if first is None else min(first, record.submit_s)
        if record.finish_s is not None:
            last = record.finish_s if last is None else max(last, record.finish_s)
    if first is None or last is None:
        return 0.0
    return max(last - first, 0.0)


def compute_metrics(
    records: Sequence[SimJobMetrics],
    *,
    capacity_gpus: int,
    allocated_gpu_s: float,
    preemptions: int,
    lost_gpu_s: float,
    invariant_violations: int,
    wall_s: float,
    lost_gpu_s_failures: float = 0.0,
) -> dict[str, Any]:
    """The JSON document of DESIGN §5 "Simulator" and §8 (exact keys, plus a few extras)."""
    overall = group_figures(records)
    makespan = makespan_s(records)
    capacity_s = capacity_gpus * makespan
    large = [
        queue for record in records if record.num_gpus > 8 and (queue := record.queue_s) is not None
    ]
    return {
        "jobs": overall["jobs"],
        "completed": overall["completed"],
        "avg_jct_s": overall["avg_jct_s"],
        "avg_queue_s": overall["avg_queue_s"],
        "p50_queue_s": overall["p50_queue_s"],
        "p99_queue_s": overall["p99_queue_s"],
        "max_queue_s": overall["max_queue_s"],
        "avg_queue_gt8_s": _mean(large),
        "gpu_utilization": allocated_gpu_s / capacity_s if capacity_s > 0 else 0.0,
        "makespan_s": makespan,
        "preemptions": preemptions,
        "lost_gpu_s": lost_gpu_s,
        "lost_gpu_s_failures": lost_gpu_s_failures,
        "invariant_violations": invariant_violations,
        "per_tenant": _grouped(records, lambda record: record.tenant),
        "per_priority": _grouped(records, lambda record: record.priority),
        "wall_s": wall_s,
        # Extras (allowed beside the contract's keys).
        "started": overall["started"],
        "jobs_gt8": sum(1 for record in records if record.num_gpus > 8),
        "capacity_gpus": capacity_gpus,
        "allocated_gpu_s": allocated_gpu_s,
    }
