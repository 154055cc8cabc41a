"""Preemption for fairness: short work first without knowing runtimes (Tiresias' 2D-LAS).

A waiting job may have a running gang of its own queue and priority class evicted
(checkpoint-then-evict, as every preemption) when that gang has received much more service:

- level: the victim's attained-service level (core/attained.py) is at least
  `fairness_level_gap` above the waiting job's (hysteresis between levels);
- minimum runtime: the victim's gang has held its GPUs for `fairness_min_runtime_s` (and its
  own `min_runtime_s`), and was not itself preempted within the policy's hysteresis window
  (`is_protected`), so nothing thrashes;
- gain over cost: under LAS a gang that has run for `r` seconds is expected to run about as
  long again, so evicting it saves the waiting job about `r` seconds on each of its GPUs;
  the price is the victim's GPUs times the checkpoint write plus the work lost since its last
  checkpoint (none when the write fits in the grace period: the eviction's own checkpoint
  holds everything). The gain must be `fairness_gain_factor` times the cost;
- large gangs do not pay for small jobs: a gang over `fairness_protected_gang_gpus` GPUs is
  never evicted for a job of at most that many.

It works within a team's guaranteed share: only a queue with a guarantee, and only where the
job, once its victims are gone, runs within that guarantee. Only the waiting job's own queue
gives up capacity, so a team's fairness never costs another team (the guarantees of DESIGN §4
are untouched), and only within a class (priorities are the
priority planner's business, core/preemption.py). The victims of the highest level go first,
the youngest of a level first (the least sunk into the attempt).
"""

from __future__ import annotations

from bisect import bisect_right

from core.attained import job_level
from core.checkpointing import declared_interval_s
from core.context import CycleContext
from core.fairness_pools import Pool, forget_changes, pool_of
from core.placement import Snapshot, find_placement
from core.preemption import (
    Eviction,
    _quota_room,
    credit_leaving,
    request_evictions,
    search_victims,
)
from core.quota import QuotaBook
from core.state import CoreJob

# Waiting jobs that capacity or their queue's ceiling holds back: those fairness may help.
_HELPED_CODES = frozenset(
    {"quota_ceiling", "no_capacity", "backfill_blocked", "reserved_head", "behind_head"}
)
MAX_FAIRNESS_PREEMPTORS_PER_CYCLE = 8
MAX_FAIRNESS_ATTEMPTS = 16


def lost_work_s(victim: CoreJob, run_s: float, write_s: float, grace_s: float) -> float:
    """Seconds of the victim's work an eviction now would lose."""
    if write_s <= grace_s:
        return 0.0  # the eviction's checkpoint is written in time and holds all progress
    # The service's floor applies: a gang declaring 10 s is checkpointed every 60 s.
    interval = declared_interval_s(victim.spec)
    if interval is None:
        return run_s  # no periodic checkpoints, or `auto`: counted as none (the safe side)
    return run_s % interval


def eviction_cost_gpu_s(victim: CoreJob, now: float, ctx: CycleContext) -> float:
    """The victim's GPUs times the checkpoint write plus the work lost since its checkpoint."""
    policy = ctx.policy
    held_since = victim.held_since
    run_s = 0.0 if held_since is None else now - held_since
    write_s = policy.checkpoint_write_estimate_s
    lost = lost_work_s(victim, run_s, write_s, policy.preemption_grace_s)
    return victim.bound_gpus * (write_s + lost)


def _eligible_at(victim: CoreJob, preemptor_gpus: int, ctx: CycleContext) -> float:
    """From when the gain of evicting the victim for `preemptor_gpus` GPUs outweighs its cost
    and the victim has run its fairness minimum (with no periodic checkpoint cost changing
    over time this is exact; otherwise it is checked again then)."""
    policy = ctx.policy
    held_since = victim.held_since
    started = ctx.now if held_since is None else held_since
    cost = eviction_cost_gpu_s(victim, ctx.now, ctx)
    worth = started + policy.fairness_gain_factor * cost / max(preemptor_gpus, 1)
    return max(started + policy.fairness_min_runtime_s, worth)


def preempt_for_fairness(
    ctx: CycleContext,
    snap: Snapshot,
    waiting: list[CoreJob],
    quota: QuotaBook,
    *,
    every_job: bool = False,
) -> None:
    """Phase 6b of the cycle (after the priority planner): evictions for attained service.

    `every_job`: walk every waiting job, as the reference; without, only the jobs that can
    do anything here (below): the same evictions, outcomes and wake-ups.
    """
    policy, now = ctx.policy, ctx.now
    forget_changes(ctx)
    if not policy.fairness_preemption or policy.order_key is not None:
        return
    hysteresis = policy.hysteresis_s
    if not every_job and not now < -hysteresis + hysteresis:
        # A job of a queue without a guarantee evicts no one here: all it can do below is note
        # the end of its calm as a wake-up, and only once it caused a preemption (else its calm
        # ended at 0). Passed over by the walk below one by one at ~0.35 µs, ~10,000 of them in
        # every busy cycle of a cluster whose queues have no guarantee (one read each here);
        # the others keep their order, and the walk stops at the same job (only those kept
        # move its counts).
        guaranteed = quota.guaranteed()
        if guaranteed:
            waiting = [
                job
                for job in waiting
                if job.queue in guaranteed or job.last_preempting_at is not None
            ]
        else:
            waiting = [job for job in waiting if job.last_preempting_at is not None]
    taken: set[str] = set()
    pools: dict[tuple[str, int], Pool] = {}
    # When a gang of the pool first reaches a level, by pool, level and largest victim.
    climbs: dict[tuple[str, int, int, int | None], float | None] = {}
    # (queue, class, level, small, NVLink) → the fewest GPUs that found no victims: a gang as
    # large fails too. A tp gang that needs NVLink (`Shape.nvlink`) fails where one that does
    # not may succeed (on nodes without NVLink): its failure says nothing of the others'.
    failed: dict[tuple[str, int, int, bool, bool], int] = {}
    preemptors = attempts = 0
    others_borrow: dict[str, bool] = {}
    # Every waiting job is looked at in every cycle, nearly all of them only to be passed over
    # (1.7 million on the `philly_noest.csv` week): what does not change within the cycle is
    # read once (a queue's guarantee, a class's rank: the quota book's configuration and the
    # policy), and the job's level is `job_level` inlined (the same sum, the same bisection).
    outcomes, handled, wakeups = ctx.outcomes, ctx.handled, ctx.wakeups
    idle = policy.idle_only_priority
    protected_gpus = policy.fairness_protected_gang_gpus
    thresholds = policy.las_thresholds_gpu_s
    guarantees: dict[str, int] = {}
    ranks: dict[str, int] = {}
    for job in waiting:
        if preemptors >= MAX_FAIRNESS_PREEMPTORS_PER_CYCLE or attempts >= MAX_FAIRNESS_ATTEMPTS:
            break
        shape = job.shape
        job_id = job.job_id
        outcome = outcomes.get(job_id)
        if shape is None or outcome is None or outcome.code not in _HELPED_CODES:
            continue
        priority = job.priority
        if job_id in handled or priority == idle:
            continue
        if job.awaiting_victims and ctx.victims_pending(job):
            continue
        calm_until = (job.last_preempting_at or -hysteresis) + hysteresis
        if now < calm_until:
            wakeups.append(calm_until)
            continue
        queue = job.queue
        guarantee = guarantees.get(queue)
        if guarantee is None:
            guarantee = guarantees[queue] = quota.guarantee(queue)
        if guarantee <= 0:
            continue  # fairness works within a team's guaranteed share: none, nothing to share
        rank = ranks.get(priority)
        if rank is None:
            rank = ranks[priority] = policy.priority_class(priority).rank
        service = job.attained_gpu_s
        if job.ranks and job.started_at is not None:
            service += job.bound_gpus * max(0.0, now - job.started_at)
        level = bisect_right(thresholds, service)
        min_gpus = shape.min_gpus
        small = min_gpus <= protected_gpus
        key = (queue, rank, level, small, shape.nvlink)
        least = failed.get(key)
        if least is not None and min_gpus >= least:
            continue
        credit_leaving(ctx, quota)
        if quota.within_guarantee(job.queue, shape.min_gpus):
            borrowed = others_borrow.get(job.queue)
            if borrowed is None:
                borrowed = others_borrow[job.queue] = _others_borrow(ctx, quota, job)
            if borrowed:
                continue  # it may reclaim borrowed GPUs (core/preemption.py): borrowers first
        pool = pools.get((job.queue, rank))
        if pool is None:
            pool = pools[(job.queue, rank)] = pool_of(ctx, job.queue, rank)
        victims: list[CoreJob] = []
        soonest: float | None = None
        for index, (vlevel, victim) in enumerate(pool):
            if vlevel < level + policy.fairness_level_gap:
                # The pool is sorted by level, highest first. Running gangs climb: the first
                # to reach the level needed may be evicted then, a moment to be woken at.
                if not victims:
                    largest = policy.fairness_protected_gang_gpus if small else None
                    needed = level + policy.fairness_level_gap
                    climb = (job.queue, rank, needed, largest)
                    if climb in climbs:
                        rises = climbs[climb]
                    else:
                        rises = climbs[climb] = _level_reached_at(pool, index, climb, ctx)
                    if rises is not None:
                        soonest = rises if soonest is None else min(soonest, rises)
                break
            if victim.job_id in taken or victim.job_id in ctx.released:
                continue
            if small and victim.bound_gpus > policy.fairness_protected_gang_gpus:
                continue
            eligible_at = _eligible_at(victim, shape.min_gpus, ctx)
            if eligible_at > now:
                soonest = eligible_at if soonest is None else min(soonest, eligible_at)
                continue
            victims.append(victim)
        if not victims:
            if soonest is not None:
                ctx.wakeups.append(soonest)
            failed[key] = min(failed.get(key, shape.min_gpus), shape.min_gpus)
            continue
        if not _within_guarantee(quota, job, shape.min_gpus, victims):
            # Even every victim gone leaves it borrowing: fairness never makes a team borrow.
            failed[key] = min(failed.get(key, shape.min_gpus), shape.min_gpus)
            continue
        attempts += 1
        chosen = _plan(snap, quota, job, victims)
        if chosen is not None and not _within_guarantee(quota, job, shape.min_gpus, chosen):
            chosen = None
        if chosen is None:
            failed[key] = min(failed.get(key, shape.min_gpus), shape.min_gpus)
            continue
        preemptors += 1

        def reason(victim: CoreJob, job: CoreJob = job, level: int = level) -> str:
            return (
                f"preempted for job {job.job_id} (fairness: attained-service level "
                f"{job_level(victim, now, policy)} against {level})"
            )

        request_evictions(
            ctx,
            job,
            chosen,
            Eviction(
                reason=reason,
                code="fairness",
                waiting=job.need,
                because=" (they have received more service)",
            ),
            quota,
            policy,
        )
        taken.update(victim.job_id for victim in chosen)


# The pool's gangs below a level that may reach it first, for the last pool seen of each
# (queue, class, level needed, largest victim): (that pool, the thresholds, the latest start
# among the pool's running gangs, [(moment, gang)] of the gangs whose clock-free moment
# `started + (threshold - attained) / rate` is within `_CLIMB_SLACK_S` of the soonest). A kept
# pool is the same list while none of its gangs changed (core/fairness_pools.py), and a gang's
# moment depends on nothing else.
_Climbers = tuple[Pool, tuple[float, ...], float, list[tuple[float, CoreJob]]]
_climbers: dict[tuple[str, int, int, int | None], _Climbers] = {}
# Far above the rounding of a moment (about 1e-6 s at today's clock): each gang whose moment
# is within this of the soonest is worked out at `now` as before, so the soonest is the same
# float, whichever of near-equal moments the rounding puts first.
_CLIMB_SLACK_S = 1e-3


def _level_reached_at(
    pool: Pool, index: int, climb: tuple[str, int, int, int | None], ctx: CycleContext
) -> float | None:
    """The first moment a running gang of `pool[index:]` (of at most `climb`'s largest GPUs)
    reaches attained-service level `climb`'s needed (None: none can); a microsecond later, so
    that the level is reached by then whatever the rounding of the moment.

    Asked in nearly every cycle with a job to help, of pools that change less often: the
    gangs that may reach the level first are kept with the pool, and only their moments are
    worked out at `now` (on the `philly_noest.csv` week, 32,159 of 41,393 asks found the pool
    unchanged)."""
    thresholds = ctx.policy.las_thresholds_gpu_s
    needed, largest = climb[2], climb[3]
    if needed < 1 or needed > len(thresholds):
        return None
    threshold, now = thresholds[needed - 1], ctx.now
    kept = _climbers.get(climb)
    if kept is None or kept[0] is not pool or kept[1] is not thresholds or now < kept[2]:
        climbers: list[tuple[float, CoreJob]] = []
        soonest_at, latest = float("inf"), float("-inf")
        for position in range(index, len(pool)):
            victim = pool[position][1]
            rate = victim.bound_gpus
            started = victim.started_at
            if not victim.ranks or started is None or rate <= 0:
                continue
            if largest is not None and rate > largest:
                continue
            moment_at = started + (threshold - victim.attained_gpu_s) / rate
            climbers.append((moment_at, victim))
            if moment_at < soonest_at:
                soonest_at = moment_at
            if started > latest:
                latest = started
        bound = soonest_at + _CLIMB_SLACK_S
        near = [entry for entry in climbers if entry[0] <= bound]
        _climbers[climb] = (pool, thresholds, latest, near)
        if now < latest:
            near = climbers  # a gang starting after `now`: its moment at `now` is another
    else:
        near = kept[3]
    soonest: float | None = None
    for _, victim in near:
        rate = victim.bound_gpus
        started = victim.started_at
        assert started is not None
        # attained_service(victim, now) inlined (the same sum, so the same moment).
        service = victim.attained_gpu_s + rate * max(0.0, now - started)
        moment = now + (threshold - service) / rate + 1e-6
        if soonest is None or moment < soonest:
            soonest = moment
    return soonest


def _others_borrow(ctx: CycleContext, quota: QuotaBook, job: CoreJob) -> bool:
    """Whether a queue off the job's own chain holds more than its guarantee."""
    own = quota.chain(job.queue)
    return any(quota.borrowing(name) > 0 for name in ctx.state.queue_records if name not in own)


def _within_guarantee(quota: QuotaBook, job: CoreJob, gpus: int, victims: list[CoreJob]) -> bool:
    """Whether the job's queue stays within its guarantee once the victims are gone and the
    job runs: fairness reorders a team's guaranteed share, it never makes the team borrow."""
    freed = sum(victim.bound_gpus for victim in victims)
    return quota.usage.get(job.queue, 0) - freed + gpus <= quota.guarantee(job.queue)


def _plan(
    snap: Snapshot, quota: QuotaBook, job: CoreJob, victims: list[CoreJob]
) -> list[CoreJob] | None:
    """The victims to evict so that the job fits its queue's ceilings and the cluster."""
    shape = job.shape
    assert shape is not None
    excess = quota.excess(job.queue, shape.min_gpus)
    if find_placement(snap, shape, False) is not None:
        if not excess:
            return None  # only a reservation holds it back: nothing to evict for
        return _quota_room(quota, excess, victims, [])
    if snap.total_free + sum(v.bound_gpus for v in victims) < shape.min_gpus:
        return None
    with snap.trial() as planning:
        planning.reserved = frozenset()
        chosen = search_victims(planning, shape, victims)
    if chosen is not None and excess:
        chosen = _quota_room(quota, excess, victims, chosen)
    return chosen
