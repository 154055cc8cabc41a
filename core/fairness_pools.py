"""Preemption for fairness's pools of victims, kept from cycle to cycle (core/fairness.py).

A pool is a queue's gangs of one priority class that may be preempted at all, by attained-service
level, highest first, then the youngest. Built afresh, it costs a look at every gang of the
queue in every cycle that has a job to help (on the `philly_noest.csv` week, rebuilding the
pools whenever one gang of the queue changed cost a quarter of the week's CPU), though between
two cycles few gangs change. Each gang's entry depends only on that gang and the clock:

- its state, ranks, start and last preemption: each change of those is a holding-state change
  the state reports (`watch_holding`; a holding gang's spec never changes, core/state.py
  `_on_updated`), and the gang is looked at again;
- the clock: its protection ends (its minimum runtime, the hysteresis after a preemption: the
  moment `is_protected` notes as its wake-up) or, running, it climbs a level as it receives
  service: the gang is looked at again from that moment on (a level a little before it);
- the gangs the reactions phase handled in this cycle, which the pool leaves out for that
  cycle only, with their wake-ups.

So a kept pool is exactly the pool built afresh, and so are the wake-ups its protected gangs
add (each still ahead of the clock). Nothing here decides: `pool_of` returns the same list
and adds the same wake-ups as `build_pool` (tests/core/test_fairness_pools.py checks both).
"""

from __future__ import annotations

import heapq
import weakref
from bisect import bisect_left, bisect_right
from dataclasses import dataclass

from core.context import CycleContext
from core.policy import SchedulingPolicy
from core.preemption import is_protected
from core.state import CoreJob, HoldingWatch
from core.surface import PlanningSurface

__all__ = ["Pool", "build_pool", "forget", "forget_changes", "pool_of"]

# (level, gang), highest level first, then the youngest.
Pool = list[tuple[int, CoreJob]]

# A level is kept this long before the moment a gang reaches the next one: a margin far above
# the rounding of the moment, so that a kept level is never one the clock has passed.
_LEVEL_MARGIN_S = 1e-3


@dataclass(slots=True)
class _Live:
    """A queue's pool for one class, kept up to date gang by gang: a gang is looked at again
    when it changes (a holding change), when its protection ends (its wake-up) and when it is
    about to reach another level, and only then; every other gang's entry stands as it is."""

    # (-level, -held since, seq, job id) of the pool's gangs, in pool order.
    order: list[tuple[int, float, int, str]]
    # The gang of each entry, by job id, with its entry.
    member: dict[str, tuple[tuple[int, float, int, str], CoreJob]]
    # The wake-up each protected gang noted.
    wake: dict[str, float]
    # (moment, job id): from that moment on the gang is looked at again (a stale entry, whose
    # moment is no longer the gang's in `due`, is dropped).
    recheck: list[tuple[float, str]]
    due: dict[str, float]
    # Gangs changed since the pool was last read.
    dirty: set[str]
    # The pool as a list, entry for entry with `order` (None until first asked); a new list
    # whenever a gang's entry changes, never one handed out changed in place.
    pool: Pool | None


@dataclass(slots=True)
class _Pools:
    watch: HoldingWatch
    policy: object
    latest_now: float
    kept: dict[tuple[str, int], _Live]


_by_state: weakref.WeakKeyDictionary[PlanningSurface, _Pools] = weakref.WeakKeyDictionary()


def build_pool(
    ctx: CycleContext, queue: str, rank: int, wakeups: list[float]
) -> tuple[Pool, float]:
    """The pool afresh, its protected gangs' wake-ups added to `wakeups`, and the first moment
    one of its gangs reaches another level (inf: none will)."""
    policy, now = ctx.policy, ctx.now
    thresholds = policy.las_thresholds_gpu_s
    ranks: dict[str, int] = {}
    climbs = float("inf")
    entries: list[tuple[int, float, int, CoreJob]] = []
    handled = ctx.handled
    for victim in ctx.state.holding_of(queue).values():
        if victim.queue != queue or not victim.ranks or victim.job_id in handled:
            continue
        vrank = ranks.get(victim.priority)
        if vrank is None:
            vrank = ranks[victim.priority] = policy.priority_class(victim.priority).rank
        if vrank != rank:
            continue
        if is_protected(victim, now, policy, wakeups):
            continue
        # attained_service and service_level inlined (the same sum, the same bisection).
        service = victim.attained_gpu_s
        started = victim.started_at
        if started is not None:  # `ranks` is not empty here
            service += victim.bound_gpus * max(0.0, now - started)
        level = bisect_right(thresholds, service)
        if level < len(thresholds) and victim.started_at is not None and victim.bound_gpus > 0:
            rises = now + (thresholds[level] - service) / victim.bound_gpus
            climbs = min(climbs, rises)
        held_since = victim.held_since
        entries.append((level, now if held_since is None else held_since, victim.seq, victim))
    entries.sort(key=lambda entry: (-entry[0], -entry[1], entry[2]))
    return [(level, victim) for level, _, _, victim in entries], climbs


def forget(state: PlanningSurface) -> None:
    """Keep nothing more for this state: the next pools are built afresh."""
    pools = _by_state.pop(state, None)
    if pools is not None:
        state.unwatch_holding(pools.watch)


def forget_changes(ctx: CycleContext) -> None:
    """Note the state's holding changes since the last cycle in the pools of their queues (each
    such gang is looked at again when its pool is next read); drop every pool when the policy
    changed or no longer preempts for fairness. Called in every cycle, so that the changes
    reported never pile up."""
    state = ctx.state
    pools = _by_state.get(state)
    if pools is None:
        return
    if pools.policy is not ctx.policy or not ctx.policy.fairness_preemption:
        forget(state)
        return
    if not pools.watch.changes:
        return
    changes, pools.watch.changes = pools.watch.changes, []
    kept, jobs = pools.kept, state.job_records
    for job_id, _ in changes:
        job = jobs.get(job_id)
        if job is None:
            kept.clear()
            return
        queue = job.queue
        for key, live in kept.items():
            if key[0] == queue:
                live.dirty.add(job_id)


def pool_of(ctx: CycleContext, queue: str, rank: int) -> Pool:
    """The queue's pool for that class at `ctx.now`, its protected gangs' wake-ups added to
    the cycle's: the kept one brought up to date (only the gangs that changed, whose
    protection ended or that reach another level are looked at), else built (and kept)."""
    state, now = ctx.state, ctx.now
    forget_changes(ctx)
    pools = _by_state.get(state)
    if pools is None or now < pools.latest_now:
        forget(state)
        pools = _Pools(state.watch_holding(), ctx.policy, now, {})
        _by_state[state] = pools
    pools.latest_now = now
    holding = state.holding_of(queue)
    live = pools.kept.get((queue, rank))
    if live is None:
        live = pools.kept[(queue, rank)] = _Live([], {}, {}, [], {}, set(holding), None)
    looked: list[str] = []
    if live.dirty:
        looked.extend(live.dirty)
        live.dirty.clear()
    recheck, due = live.recheck, live.due
    while recheck and recheck[0][0] <= now:
        moment, job_id = heapq.heappop(recheck)
        if due.get(job_id) == moment:
            looked.append(job_id)
    if looked:
        policy = ctx.policy
        if live.pool is not None:
            # A copy of its own to bring up to date entry by entry, in step with `order`
            # (cheaper than wording the pool again from `order`); the list handed out before
            # stays as it was (core/fairness.py keeps what it found in one by identity).
            live.pool = list(live.pool)
        for job_id in looked:
            _look(live, holding.get(job_id), job_id, queue, rank, now, policy)
        if len(recheck) > 4 * len(due) + 64:
            live.recheck = [(moment, job_id) for job_id, moment in due.items()]
            heapq.heapify(live.recheck)
    pool = live.pool
    if pool is None:
        member = live.member
        pool = live.pool = [(-key[0], member[key[3]][1]) for key in live.order]
    # A gang the reactions phase handled in this cycle is left out of the pool, and its
    # wake-up with it, for this cycle only (each gang's entry stands on its own).
    handled = ctx.handled
    if any(job_id in holding for job_id in handled):
        pool = [entry for entry in pool if entry[1].job_id not in handled]
        wake = live.wake
        ctx.wakeups.extend(wake[job_id] for job_id in wake if job_id not in handled)
    else:
        ctx.wakeups.extend(live.wake.values())
    return pool


def _look(
    live: _Live,
    victim: CoreJob | None,
    job_id: str,
    queue: str,
    rank: int,
    now: float,
    policy: SchedulingPolicy,
) -> None:
    """The gang's entry, wake-up and next look at `now`, as `build_pool` finds them."""
    old = live.member.pop(job_id, None)
    order, pool = live.order, live.pool
    if old is not None:
        position = bisect_left(order, old[0])
        del order[position]
        if pool is not None:
            del pool[position]
    live.wake.pop(job_id, None)
    live.due.pop(job_id, None)
    if victim is None or victim.queue != queue or not victim.ranks:
        return
    if policy.priority_class(victim.priority).rank != rank:
        return
    noted: list[float] = []
    if is_protected(victim, now, policy, noted):
        if noted:
            live.wake[job_id] = live.due[job_id] = noted[0]
            heapq.heappush(live.recheck, (noted[0], job_id))
        return
    thresholds = policy.las_thresholds_gpu_s
    service = victim.attained_gpu_s
    started = victim.started_at
    if started is not None:
        service += victim.bound_gpus * max(0.0, now - started)
    level = bisect_right(thresholds, service)
    if level < len(thresholds) and started is not None and victim.bound_gpus > 0:
        moment = now + (thresholds[level] - service) / victim.bound_gpus - _LEVEL_MARGIN_S
        live.due[job_id] = moment
        heapq.heappush(live.recheck, (moment, job_id))
    held_since = victim.held_since
    key = (-level, -(now if held_since is None else held_since), victim.seq, job_id)
    position = bisect_left(order, key)
    order.insert(position, key)
    if pool is not None:
        pool.insert(position, (level, victim))
    live.member[job_id] = (key, victim)
