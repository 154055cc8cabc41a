"""Who goes first: priority class, then dominant-resource fair share, then attained service
(core/attained.py: least service level first, Tiresias' 2D-LAS), then predicted length (within
the queue's guarantee: predicted-short first), then age; aging on top.

Fair share orders the teams' claims on what they are owed, not on what they borrow: a job of a
team with a guarantee that would run beyond it is ordered among the other borrowers by class,
attained service and age alone. Borrowed GPUs are idle ones, reclaimed the moment a guarantee
needs them (core/preemption.py), so having borrowed cost no one anything and earns no penalty;
ordered by its decayed usage instead, a team that had borrowed much waited hours for a
whole-node job while teams that had borrowed less took every GPU freed (Philly, 88 x 8 with
borrowing, first week: 21,463 s against fifo's 481 s, the team's average 562 s against 174 s;
docs/simulator.md). Teams without a guarantee (no quotas) divide everything by fair share.

A job still in its retry backoff (core/retry.py) is held out of placement and says until when.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from datetime import UTC, datetime
from operator import itemgetter

from core.attained import attained_service, service_level
from core.context import CycleContext, Outcome
from core.drf import dominant_usage
from core.live_sharing import GpuAmount
from core.policy import SchedulingPolicy
from core.quota import QuotaBook
from core.reservation import runtime_estimate
from core.state import CoreJob, HostCapacity, QueueRecord
from schemas.reasons import RETRY_BACKOFF

# Smaller sorts first. The first element is the tier; keys of one tier have one shape, and
# keys of different tiers are told apart by it.
OrderKey = tuple[float, ...]
_first = itemgetter(0)


def fair_share(
    queue: QueueRecord | None,
    now: float,
    policy: SchedulingPolicy,
    capacity: HostCapacity | None = None,
) -> float:
    """The queue's recent dominant-resource usage over its entitlement (guarantee, else 1 GPU)
    and weight.

    The usage is that of the queue's dominant resource among GPUs, CPUs and memory (DRF), in
    GPU-equivalents of the fleet's `capacity` (core/drf.py); without CPUs or memory declared
    (or no capacity given) it is the GPU usage. It decays with the policy's half-life, so a
    team that ran big last week is not punished forever.
    """
    if queue is None:
        return 0.0
    usage = dominant_usage(queue, now, policy.fair_share_half_life_s, capacity)
    average_gpus = usage * math.log(2) / policy.fair_share_half_life_s
    return average_gpus / (max(queue.guaranteed_gpus, 1) * queue.weight)


def is_aged(job: CoreJob, now: float, policy: SchedulingPolicy) -> bool:
    """Waited the policy's maximum since it last began waiting (admission, requeue, resume:
    every waiting job has `queued_at`)."""
    return job.queued_at is not None and now - job.queued_at >= policy.aging_max_wait_s


def gangway_key(
    job: CoreJob,
    rank: int,
    share: float,
    aged: bool,
    victims_released: bool,
    within_guarantee: bool,
    level: int = 0,
    length: int = 0,
) -> OrderKey:
    """Smaller sorts first.

    A preemptor whose victims are gone goes first (it paid for its GPUs); then aged jobs, oldest
    first, whatever their class (aging bounds every wait); then jobs their queue's guarantee
    covers before jobs that would borrow (so that a borrower never takes what a guarantee must
    reclaim a moment later); then class rank, fair share, attained-service level (least
    first: short work goes first without knowing runtimes), predicted-length level (`length`,
    see `length_level`), age.

    Aging bounds what the level costs a job: a job passed over by lower levels for the
    policy's aging_max_wait_s since it last began waiting moves to tier 1, ahead of them all.
    """
    if victims_released:
        return (0, -rank, job.seq)
    if aged:
        return (1, job.queued_at or 0.0, job.seq)
    return (
        2,
        0 if within_guarantee else 1,
        -rank,
        share,
        level,
        length,
        job.submitted_at or 0.0,
        job.seq,
    )


def length_level(job: CoreJob, ctx: CycleContext) -> int:
    """The level of the job's predicted runtime (`runtime_estimate`: the user's estimate as the
    team's record corrects it, else what jobs like it ran, else the policy's default) among
    the policy's `predicted_length_thresholds_s`: 0 below the first.

    Levels, not seconds: a prediction is rough, so only a clearly shorter job overtakes, and
    jobs of one level keep arrival order; aging still bounds what a long job waits.
    """
    thresholds = ctx.policy.predicted_length_thresholds_s
    if not thresholds:
        return 0
    return bisect_right(thresholds, runtime_estimate(job, ctx.policy, ctx.state.estimates))


def order(ctx: CycleContext, quota: QuotaBook) -> list[CoreJob]:
    """Phase 3 of the cycle: the waiting jobs not yet handled, first to be placed first."""
    state, policy, now = ctx.state, ctx.policy, ctx.now
    candidates = [job for job in state.waiting_jobs.values() if job.job_id not in ctx.handled]
    ctx.result.considered = len(candidates)
    if policy.order_key is not None:
        order_key = policy.order_key
        candidates.sort(key=lambda job: (order_key(job.job_id), job.seq))
        return candidates
    if policy.is_fifo:
        candidates.sort(key=lambda job: job.seq)  # strict arrival order
        return candidates
    queues = state.queue_records
    capacity = state.host_capacity()
    aging = policy.aging_max_wait_s
    wakeups = ctx.wakeups
    # What many jobs share is asked once per cycle: a queue's share and guarantee, a class's
    # rank, whether a queue stays within its guarantee with a job's GPUs (the book does not
    # change while ordering), the level of an amount of service. A busy cycle orders 10,000
    # jobs of 20 queues, 4 classes and a few sizes.
    shares: dict[str, tuple[float, bool]] = {}
    ranks: dict[str, int] = {}
    within_of: dict[tuple[str, GpuAmount], bool] = {}
    levels: dict[float, int] = {}
    keyed: list[tuple[OrderKey, CoreJob]] = []
    for job in candidates:
        queue = job.queue
        known = shares.get(queue)
        if known is None:
            known = (
                fair_share(queues.get(queue), now, policy, capacity),
                quota.guarantee(queue) > 0,
            )
            shares[queue] = known
        share, guaranteed = known
        rank = ranks.get(job.priority)
        if rank is None:
            rank = ranks[job.priority] = policy.priority_class(job.priority).rank
        # is_aged and victims_released inlined (the same tests): asked of every waiting job in
        # every cycle (7.8 million on the Philly window).
        queued_at = job.queued_at
        aged = queued_at is not None and now - queued_at >= aging
        if not aged and queued_at is not None:
            wakeups.append(queued_at + aging)
        shape = job.shape
        if shape is None:
            within = False
        else:
            need = (queue, shape.min_gpus)
            within_known = within_of.get(need)
            if within_known is None:
                within_known = within_of[need] = quota.within_guarantee(queue, shape.min_gpus)
            within = within_known
        if not within and guaranteed:
            share = 0.0  # borrowing beyond a guarantee: no penalty for having borrowed
        service = attained_service(job, now)
        level = levels.get(service)
        if level is None:
            level = levels[service] = service_level(service, policy)
        # Predicted-short first only within the guarantee: a borrower keeps arrival order, so
        # a guess about its length never decides who takes capacity lent by another team.
        length = length_level(job, ctx) if within and not aged else 0
        released = bool(job.awaiting_victims) and not ctx.victims_pending(job)
        key = gangway_key(job, rank, share, aged, released, within, level, length)
        keyed.append((key, job))
    # Keys are unique (they end in the job's sequence number): the jobs are never compared.
    keyed.sort(key=_first)
    return [job for _, job in keyed]


def past_backoff(ctx: CycleContext, waiting: list[CoreJob]) -> list[CoreJob]:
    """The waiting jobs free to start now; one still in its retry backoff says until when
    (its reason, shown by `why`) and the cycle wakes then."""
    ready = []
    for job in waiting:
        retry_at = job.retry_at
        if retry_at is None or retry_at <= ctx.now:
            ready.append(job)
            continue
        ctx.wakeups.append(retry_at)
        ctx.outcomes[job.job_id] = Outcome(
            RETRY_BACKOFF,
            f"{job.need}; attempt {job.attempt} failed; "
            f"the next attempt may start at {_when_s(retry_at)} (retry backoff)",
            estimated_start=retry_at,
        )
    return ready


def _when_s(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
