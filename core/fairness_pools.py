"""Preemption for fairness's pools of victims, kept from cycle to cycle (core/fairness.py).

A pool is a queue's gangs of one priority class that may be preempted at all, by attained-service
level, highest first, then the youngest. Built afresh, it costs a look at every gang of the
queue in every cycle that has a job to help, though between two cycles it seldom changes. What it
depends on:

- the queue's holding gangs, their states, ranks, starts and last preemption: each change of
  those is a holding-state change the state reports (`watch_holding`; a holding gang's spec
  never changes, core/state.py `_on_updated`), which drops that queue's pools;
- the clock: a gang's protection ends (its minimum runtime, the hysteresis after a
  preemption: the moments `is_protected` notes as wake-ups) and a running gang climbs a level
  as it receives service. A kept pool is used only before the first such moment;
- the gangs the reactions phase handled in this cycle, which the pool leaves out: a kept pool
  with one of them is built again.

So a kept pool is exactly the pool built afresh, and so are the wake-ups its protected gangs
add (each still ahead of the clock). Nothing here decides: `pool_of` returns the same list
and adds the same wake-ups as `build_pool`.
"""

from __future__ import annotations

import weakref
from bisect import bisect_right
from dataclasses import dataclass

from core.context import CycleContext
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
class _Kept:
    pool: Pool
    # The wake-ups its protected gangs noted, and until when it stands (exclusive).
    wakeups: list[float]
    until: float


@dataclass(slots=True)
class _Pools:
    watch: HoldingWatch
    policy: object
    latest_now: float
    kept: dict[tuple[str, int], _Kept]


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
    """Drop the pools the state's holding changes since the last cycle touch; all of them when
    the policy changed or no longer preempts for fairness. Called in every cycle, so that the
    changes reported never pile up."""
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
        for key in [key for key in kept if key[0] == job.queue]:
            del kept[key]


def pool_of(ctx: CycleContext, queue: str, rank: int) -> Pool:
    """The queue's pool for that class at `ctx.now`, its protected gangs' wake-ups added to
    the cycle's: the kept one while it stands, else built (and kept)."""
    state, now = ctx.state, ctx.now
    forget_changes(ctx)
    pools = _by_state.get(state)
    if pools is None or now < pools.latest_now:
        forget(state)
        pools = _Pools(state.watch_holding(), ctx.policy, now, {})
        _by_state[state] = pools
    pools.latest_now = now
    kept = pools.kept
    # A gang the reactions phase handled in this cycle is left out of the pool (and its
    # wake-ups with it): with one in the queue, the pool is built afresh and not kept.
    handled = any(job_id in state.holding_of(queue) for job_id in ctx.handled)
    found = kept.get((queue, rank))
    if found is not None and now < found.until and not handled:
        ctx.wakeups.extend(found.wakeups)
        return found.pool
    wakeups: list[float] = []
    pool, climbs = build_pool(ctx, queue, rank, wakeups)
    ctx.wakeups.extend(wakeups)
    if handled:
        kept.pop((queue, rank), None)
    else:
        until = min(min(wakeups, default=float("inf")), climbs - _LEVEL_MARGIN_S)
        kept[(queue, rank)] = _Kept(pool, wakeups, until)
    return pool
