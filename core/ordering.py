"""Who goes first: priority class, then dominant-resource fair share, then age; aging on top."""

from __future__ import annotations

import math

from core.policy import SchedulingPolicy
from core.state import JobRecord, QueueRecord, decayed_usage

OrderKey = tuple[int, int, int, float, float, int]


def fair_share(queue: QueueRecord | None, now: float, policy: SchedulingPolicy) -> float:
    """The queue's recent GPU usage over its entitlement (guarantee, else 1 GPU) and weight.

    GPUs are the dominant (and only scheduled) resource; usage decays with the policy's
    half-life, so a team that ran big last week is not punished forever.
    """
    if queue is None:
        return 0.0
    usage = decayed_usage(
        queue.decayed_usage, queue.allocated, now - queue.usage_at, policy.fair_share_half_life_s
    )
    average_gpus = usage * math.log(2) / policy.fair_share_half_life_s
    return average_gpus / (max(queue.guaranteed_gpus, 1) * queue.weight)


def is_aged(job: JobRecord, now: float, policy: SchedulingPolicy) -> bool:
    waited_since = job.queued_at if job.queued_at is not None else job.submitted_at
    return waited_since is not None and now - waited_since >= policy.aging_max_wait_s


def gangway_key(
    job: JobRecord,
    rank: int,
    share: float,
    aged: bool,
    victims_released: bool,
    within_guarantee: bool,
) -> OrderKey:
    """Smaller sorts first.

    A preemptor whose victims are gone goes first (it paid for its GPUs); then aged jobs, oldest
    first, whatever their class (aging bounds every wait); then jobs their queue's guarantee
    covers before jobs that would borrow (so that a borrower never takes what a guarantee must
    reclaim a moment later); then class rank, fair share, age.
    """
    if victims_released:
        return (0, 0, -rank, 0.0, 0.0, job.seq)
    if aged:
        waited = job.queued_at if job.queued_at is not None else 0.0
        return (1, 0, 0, waited, 0.0, job.seq)
    return (2, 0 if within_guarantee else 1, -rank, share, job.submitted_at or 0.0, job.seq)


def fifo_key(job: JobRecord) -> OrderKey:
    """Strict arrival order across all jobs."""
    return (0, 0, 0, 0.0, 0.0, job.seq)
