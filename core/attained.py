"""Attained service (Tiresias' 2D-LAS): how much GPU time a job has received so far.

Without knowing runtimes, the least-attained-service discipline favours short work: every job
starts at the lowest level, and a job that has received much service is likely to need much
more (job runtimes are heavy-tailed). Service is GPU-seconds, so a wide gang climbs as fast as
its width; levels, not raw seconds, keep jobs of similar service in arrival order.

The service of released gangs is folded by the state from the log's own times
(`CoreJob.attained_gpu_s`, see `_release` in core/state.py), so a restarted scheduler that
replays the log gets the same value; the running gang's share is added here from its start.
"""

from __future__ import annotations

from bisect import bisect_right

from core.policy import SchedulingPolicy
from core.state import CoreJob


def attained_service(job: CoreJob, now: float) -> float:
    """GPU-seconds the job has received up to `now`, all attempts together."""
    service = job.attained_gpu_s
    if job.ranks and job.started_at is not None:
        service += job.bound_gpus * max(0.0, now - job.started_at)
    return service


def service_level(service_gpu_s: float, policy: SchedulingPolicy) -> int:
    """The level of that much service: 0 below the first threshold, k below the (k+1)-th."""
    return bisect_right(policy.las_thresholds_gpu_s, service_gpu_s)


def job_level(job: CoreJob, now: float, policy: SchedulingPolicy) -> int:
    return service_level(attained_service(job, now), policy)
