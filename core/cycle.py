"""One scheduling cycle: `schedule(state, now)` returns decisions and leaves the state alone.

The phases, in order (as in Kueue's scheduler):

1. reactions — outcomes of what happened: exits, cancels, suspends, lost nodes, drains,
   preemption deadlines, max runtime;
2. snapshot  — free GPUs after those releases, with topology aggregates (kept between
   cycles; the cycle's changes to it are undone when it ends);
3. order     — waiting jobs by class, fair share and age (aging first), or arrival for fifo,
               cut after the policy's bound on newly queued jobs (the rest wait for the
               next cycle, which follows at once: core/ordering.py `within_depth`);
               a job still in its retry backoff waits (and says until when); a held job,
               one waiting for its dependencies and an array element past its array's
               max_parallel wait too, and one whose dependencies failed is cancelled
               (core/gating.py);
4. place     — each job in order: quota, then a topology-fit placement committed whole;
5. backfill  — the first job that cannot start becomes the head: a reservation on concrete
               nodes is planned and later jobs may only start where they do not delay it;
               a job within its queue's guarantee that cannot start holds the free GPUs its
               reclaim (phase 6) will land on from the jobs behind it, as a preemptor
               awaiting its victims does (core/preemption.py `ReclaimLandings`);
6. preempt   — checkpoint-then-evict borrowers' slices and shares for whole-GPU gangs
               (core/sharing_reclaim.py), whole gangs for jobs entitled to them, any
               slices and shares the rules allow for whole-GPU gangs, then slices,
               shares and small gangs for slice and share jobs (core/share_preemption.py);
               then, when the policy asks, for attained service within a queue
               (core/fairness.py);
7. explain   — a reason (and estimated start) for every job still waiting, recorded on change.

Each phase is a function of one `CycleContext` (core/context.py): `react` (core/reactions.py),
`order` (core/ordering.py), `place` (core/backfill.py), `preempt` (core/preemption.py) and
`explain` here.

The caller records `decisions` in order and folds each back with `state.apply(event, now)`:
releases come before the bindings that reuse their GPUs. A caller that runs cycle after cycle
keeps a `Planner`: it holds what one cycle leaves for the next (the placement index, the memo
of a quiet cycle). A cycle allocates many short-lived objects and no reference cycles, so a
long-running caller may pause the cyclic garbage collector around it; that is the caller's
choice, not the core's.
"""

from __future__ import annotations

import weakref
from functools import partial
from operator import lt

from core.backfill import place
from core.built_events import job_deferred
from core.context import CycleContext, CycleResult
from core.fairness import preempt_for_fairness
from core.fractional import plan_repartitions, sharing_trial
from core.gating import DependencyBook, gate
from core.ordering import OrderBook, order, past_backoff, within_depth
from core.placement import FreeIndex, Snapshot
from core.preemption import VictimBook, book_arriving, preempt
from core.quota import QuotaBook
from core.reactions import react
from core.share_preemption import preempt_for_fractions
from core.sharing_reclaim import reclaim_shared_gpus
from core.slo import refill_headroom
from core.state import CoreJob, rank_host
from core.surface import PlanningSurface
from core.timers import GangTimers

__all__ = ["CycleResult", "Planner", "schedule"]


class Planner:
    """What one scheduler keeps from cycle to cycle for the state it plans for.

    The free-capacity index (kept up to date from the nodes the state says changed), the
    holding gangs' timers (kept up to date from the gangs the state says changed) and the
    memo of the last quiet cycle: a state that has not changed since a cycle that decided
    nothing, asked again at that same moment, gets that answer at once. Not at a later moment,
    even before the next wake-up: fair share decays with the clock (core/ordering.py), so the
    order of two queues may turn at any instant, and a fresh planner would decide on it.
    """

    __slots__ = (
        "_behind_memo",
        "_dependencies",
        "_free_index",
        "_order_book",
        "_quiet",
        "_timers",
        "_victims",
    )

    def __init__(
        self,
        *,
        timers: bool = True,
        behind_memo: bool = True,
        kept_order: bool = True,
        kept_victims: bool = True,
        kept_verdicts: bool = True,
        undo_index: bool = False,
    ) -> None:
        # The free-capacity index; with `undo_index`, what each cycle changed in it is undone
        # when the cycle ends rather than read again from the state at the next cycle's start
        # (core/placement.py `FreeIndex`: the reference it is tested against).
        self._free_index = FreeIndex(undo=undo_index)
        # The waiting jobs kept in order between cycles (core/ordering.py `OrderBook`);
        # without, every cycle keys and sorts them all (the reference it is tested against).
        self._order_book = OrderBook() if kept_order else None
        # Outcomes of jobs behind the head answered per shape (core/backfill.py `place`);
        # without, each job's is worked out on its own (the reference it is tested against).
        self._behind_memo = behind_memo
        # The holding gangs' deadlines and estimated ends: reactions visit only those due.
        # Without them every holding gang is visited in every cycle: the same decisions and
        # wake-ups, slower (the reference the timers are tested against).
        self._timers = GangTimers() if timers else None
        # The gangs that may be preempted, kept between cycles (core/preemption.py
        # `VictimBook`); without, each cycle that preempts builds its pool from every holding
        # gang (the reference the book is tested against).
        self._victims = VictimBook() if kept_victims else None
        # The gated jobs' dependency verdicts, kept between cycles (core/gating.py
        # `DependencyBook`); without, each cycle works out every one (the reference).
        self._dependencies = DependencyBook() if kept_verdicts else None
        # (state, its version, its moment, next wake-up) of the last cycle that decided
        # nothing; the state held weakly, as by the index: a planner never keeps a state alive.
        self._quiet: tuple[weakref.ref[PlanningSurface], int, float, float] | None = None

    def schedule(self, state: PlanningSurface, now: float) -> CycleResult:
        """Decide what to do at `now`. Pure with respect to the state's contents."""
        quiet = self._quiet
        if (
            quiet is not None
            and quiet[0]() is state
            and quiet[1] == state.version
            and now == quiet[2]
        ):
            return CycleResult(skipped=True, next_wakeup=quiet[3])
        result = _run(
            CycleContext.start(state, now),
            self._free_index,
            self._timers,
            self._behind_memo,
            self._order_book,
            self._victims,
            self._dependencies,
        )
        if result.decisions:
            self._quiet = None
        else:
            wakeup = result.next_wakeup if result.next_wakeup is not None else float("inf")
            self._quiet = (weakref.ref(state), state.version, now, wakeup)
        return result


# The planner of each live state for callers that keep none of their own (`schedule(state,
# now)`): a state's cycles reuse its index and memo as long as the state lives, and the
# planner goes with it. Callers that run for long (the service, the simulator) hold theirs.
_planners: weakref.WeakKeyDictionary[PlanningSurface, Planner] = weakref.WeakKeyDictionary()


def schedule(state: PlanningSurface, now: float, planner: Planner | None = None) -> CycleResult:
    """One cycle at `now`, by `planner`, else by the planner kept for this state."""
    if planner is None:
        planner = _planners.get(state)
        if planner is None:
            planner = _planners[state] = Planner()
    return planner.schedule(state, now)


def _run(
    ctx: CycleContext,
    free_index: FreeIndex,
    timers: GangTimers | None,
    behind_memo: bool,
    order_book: OrderBook | None,
    victims: VictimBook | None,
    dependencies: DependencyBook | None,
) -> CycleResult:
    react(ctx, timers)
    state = ctx.state
    with free_index.snapshot(state) as snap, sharing_trial(ctx, snap):
        _release_into(ctx, snap)
        quota = QuotaBook(state.queue_records)
        jobs = state.job_records
        for job_id in ctx.released:
            job = jobs[job_id]
            quota.charge(job.queue, -job.bound_gpus)
        waiting = order(ctx, quota, order_book)
        # (After the order: a preemptor's own arrival does not put it behind its queue's
        # other jobs, as beyond its guarantee.)
        book_arriving(ctx, quota)
        considered = within_depth(ctx, waiting)
        placed = place(
            ctx,
            snap,
            gate(ctx, past_backoff(ctx, considered), dependencies),
            quota,
            behind_memo=behind_memo,
            victims=victims,
        )
        # MIG geometries for waiting slices, a whole GPU back for gangs (core/fractional.py).
        plan_repartitions(ctx, snap, placed.blocked)
        placed.give_back_holds(snap)
        if ctx.policy.preemption and not ctx.policy.is_fifo:
            # Borrowed capacity first, whether gangs or slices and shares hold it.
            reclaimed = reclaim_shared_gpus(ctx, snap, placed.blocked, quota, borrowers_only=True)
            blocked = placed.blocked
            if reclaimed:  # (a busy cycle blocks ~9,500 jobs: filtered only when there is cause)
                blocked = [j for j in blocked if j.job_id not in reclaimed]
            preempt(ctx, snap, blocked, quota, victims)
            reclaim_shared_gpus(ctx, snap, placed.blocked, quota)
            preempt_for_fractions(ctx, snap, quota)
            refill_headroom(ctx, snap, quota)
            preempt_for_fairness(ctx, snap, considered, quota)
    explain(ctx, waiting)
    if victims is not None:
        # Every cycle, preempting or not: the holding watch's changes never pile up.
        victims.sync(state, ctx.now)
    # A moment already reached was acted on (or needs nothing) in this very cycle.
    # (Filtered in C: a busy cycle notes a wake-up for nearly every waiting job.)
    ctx.result.next_wakeup = min(filter(partial(lt, ctx.now), ctx.wakeups), default=None)
    return ctx.result


def _release_into(ctx: CycleContext, snap: Snapshot) -> None:
    """Phase 2, snapshot: give it the GPUs of the gangs this cycle released, less those where
    a started rank has not exited yet: it still runs there (see state._keep_running_ranks),
    and those where a rank of a gang released before lingers (an agent may start a released
    rank late, on GPUs given to this gang since). Their CPUs and memory all come back, as the
    state gives them back at release: a stopping rank keeps only its GPUs, in this cycle as in
    the next."""
    jobs = ctx.state.job_records
    nodes = ctx.state.node_records
    for job_id in sorted(ctx.released):
        job = jobs[job_id]
        cpus, memory = rank_host(job.spec)
        for rank, (node_index, mask) in enumerate(job.ranks):
            if cpus or memory:
                snap.shift_host(node_index, -cpus, -memory)
            if job.still_runs(rank):
                continue
            snap.release(node_index, mask & ~nodes[node_index].lingering_mask)


def explain(ctx: CycleContext, waiting: list[CoreJob]) -> None:
    """Phase 7: a JobDeferred for every waiting job whose reason changed."""
    # Lookups bound once and `ctx.emit` inlined: a burst's first cycle gives ~9,400 waiting
    # jobs their first reason, and a busy cycle reads every waiting job's.
    outcome_of = ctx.outcomes.get
    emit = ctx.result.decisions.append
    for job in waiting:
        outcome = outcome_of(job.job_id)
        if outcome is None:
            continue
        code, message = outcome.code, outcome.message
        if job.reason_code != code or job.reason != message:
            emit(job_deferred(job.job_id, code, message))
