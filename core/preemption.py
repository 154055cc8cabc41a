"""The preemption planner: whole gangs, borrowers first, then the lowest priority, then the
smallest set that suffices; never a protected gang (non-preemptible, younger than its minimum
runtime, or preempted within the hysteresis window)."""

from __future__ import annotations

import heapq
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence, Set
from dataclasses import dataclass
from itertools import chain
from operator import itemgetter

from core.context import CycleContext, Outcome
from core.host import release_gang
from core.live_sharing import GpuAmount
from core.placement import Allocation, Shape, Snapshot, find_placement
from core.policy import PriorityClass, SchedulingPolicy
from core.quota import QuotaBook
from core.reservation import kept_off_reserved, record_reservation, runtime_estimator
from core.shape import pool_suits, shape_pools
from core.slo import bounded_victims
from core.state import CoreJob, HoldingWatch, NodeRecord, popcount
from core.state_index import StateIndex, merge_sorted
from core.surface import PlanningSurface
from schemas.jobs import WAITING_STATES, PreemptionRequested
from schemas.reasons import PreemptCode

MAX_CANDIDATES = 512
MAX_TRIES = 48
MAX_PREEMPTORS_PER_CYCLE = 8
MAX_PREEMPTION_ATTEMPTS = 16

_first = itemgetter(0)


def book_arriving(ctx: CycleContext, quota: QuotaBook) -> None:
    """Preemptors on their way in: each waiting job whose victims are still leaving counts the
    GPUs it asked for (its shape's least, what its reclaim was judged by) to its queue, from
    the cycle it asks for evictions (`request_evictions`) until it lands. Booked as the cycle's
    quota book is made, before any job is placed.

    Uncounted, a queue owed 4 GPUs reclaimed 4 for each of its waiting jobs, in one cycle and
    in every cycle while the first victims checkpointed; and a job of the queue behind a
    reclaim took the quota room the reclaim was for (GPUs come free elsewhere meanwhile),
    leaving the preemptor at its ceiling when its victims had gone: evicted for nothing."""
    state, released = ctx.state, ctx.released
    records = state.job_records
    for victim in state.preempting_jobs.values():
        preemptor_id = victim.preemptor_id
        if victim.job_id in released or preemptor_id is None:
            continue
        preemptor = records.get(preemptor_id)
        if preemptor is not None and preemptor.state in WAITING_STATES:
            _arrives(ctx, quota, preemptor)


def _arrives(ctx: CycleContext, quota: QuotaBook, preemptor: CoreJob) -> None:
    """The preemptor's GPUs to its queue, once a cycle (`book_arriving`)."""
    shape = preemptor.shape
    if shape is not None and preemptor.job_id not in ctx.arriving:
        ctx.arriving.add(preemptor.job_id)
        quota.charge(preemptor.queue, shape.min_gpus)


def credit_leaving(ctx: CycleContext, quota: QuotaBook) -> None:
    """Gangs already under eviction leave soon: their queues are not borrowing them.

    Counting them made each later cycle take another gang of a lender already giving back its
    borrowed GPUs, until it fell below its guarantee (invariant 4). A gang this very cycle
    asked to checkpoint and stop (a drain, a suspend, its max runtime: decided, not released)
    leaves as surely: counted, its team looked like a borrower, and a gang of the same team
    within its guarantee was taken for another team.
    """
    if ctx.leaving_credited:
        return
    ctx.leaving_credited = True
    for queue, gpus in _leaving(ctx).items():
        quota.charge(queue, -gpus)


def preempt(
    ctx: CycleContext,
    snap: Snapshot,
    blocked: list[CoreJob],
    quota: QuotaBook,
    book: VictimBook | None = None,
) -> None:
    """Phase 6 of the cycle: checkpoint-then-evict whole gangs for jobs entitled to them.

    With `book` (a planner's), the victim pool kept between cycles; without, built afresh."""
    policy, now = ctx.policy, ctx.now
    taken: set[str] = set()
    preemptors = 0
    attempts = 0
    pool: VictimPool | None = None
    # Victims only get scarcer within a cycle: a shape that found none makes larger fail,
    # for the same queue (which gangs a preemptor may take depends on its queue: its own
    # lower classes, other queues' borrowers).
    failed: dict[tuple[object, ...], int] = {}
    # Per (class, queue, GPUs): the class and whether the queue reclaims, while the quota book
    # takes no charge. A cycle with free GPUs the head's reservation holds reaches here with
    # ~10,000 blocked jobs of a few classes, queues and sizes, most of which may not preempt.
    entitled: dict[tuple[str, str, int], tuple[int, PriorityClass, bool]] = {}
    credited = False
    kept_off = KeptOff(ctx)
    for job in blocked:
        if preemptors >= MAX_PREEMPTORS_PER_CYCLE or attempts >= MAX_PREEMPTION_ATTEMPTS:
            break
        # (No job awaiting its victims is blocked: placing holds where it lands instead.)
        shape = job.shape
        if shape is None or shape.cpu_only:
            continue  # a CPU-only gang waits for CPUs; it evicts no one
        if not credited:
            credit_leaving(ctx, quota)
            credited = True
        asked = (job.priority, job.queue, shape.min_gpus)
        known = entitled.get(asked)
        if known is None or known[0] != quota.charges:
            known = entitled[asked] = (
                quota.charges,
                policy.priority_class(job.priority),
                quota.within_guarantee(job.queue, shape.min_gpus),
            )
        _, pclass, reclaiming = known
        # An overdue reservation is no ground: gangs running past their estimates are not
        # evicted for it (an estimate is never a limit); the reservation is planned again.
        if not (pclass.can_preempt or reclaiming):
            continue
        if job.priority == policy.idle_only_priority:
            continue
        # (Asked of the jobs that may preempt, not of every blocked job: a job that may not
        # has no calm's end to wake up for.)
        if ctx.calming(job):
            continue
        # Reclaiming, off the head's reserved nodes (the backfill rule): their idle GPUs do not
        # serve it (invariant 4). A job preempting by its class alone still counts them and
        # waits for them rather than evicting (`KeptOff`).
        off = reclaiming and kept_off(job)
        key = (
            pclass.rank,
            reclaiming,
            job.queue,
            *shape.failure_key(off),
        )
        if key in failed and shape.min_units >= failed[key]:
            continue
        if pool is None:
            pool = victim_pool(ctx, book)
        if not pool.size:
            break
        attempts += 1
        request = PreemptionRequest(
            preemptor=job,
            shape=shape,
            pclass=pclass,
            reclaiming=reclaiming,
            excluded=ctx.released | taken,
            now=now,
            policy=policy,
            kept_off=off,
        )
        plan = plan_preemption(request, snap, quota, pool)
        if plan is None:
            failed[key] = min(failed.get(key, shape.min_units), shape.min_units)
            continue
        preemptors += 1
        if ctx.reservation is not None and job.job_id == ctx.reservation.head.job_id:
            ctx.reservation.evicting = True
        if off and ctx.reservation is not None:
            # The log names the reservation this eviction rested on, in this cycle, before
            # the evictions (the auditor judges them by it).
            record_reservation(ctx, ctx.reservation)
        why = "reclaiming guaranteed capacity" if reclaiming else f"priority {job.priority}"
        request_evictions(
            ctx,
            job,
            plan,
            Eviction(
                reason=f"preempted for job {job.job_id} ({why})",
                code="reclaim" if reclaiming else "priority",
                waiting=job.need,
            ),
            quota,
            policy,
        )
        taken.update(victim.job_id for victim in plan)


class KeptOff:
    """Which blocked jobs of the cycle the backfill rule keeps off the head's reserved nodes
    (core/reservation.py `kept_off_reserved`): those behind the head, not the head, that
    would not end before its planned start. None where the cycle planned no reservation, nor
    once the head asked for evictions itself (it lands on its victims' GPUs instead).

    Asked for jobs that reclaim (within their queue's guarantee): the idle GPUs there do not
    serve them, so they take borrowed GPUs elsewhere rather than wait as long as the head
    (invariant 4). A job that preempts by its class alone is not asked: it waits for the
    head's idle GPUs rather than evict lower classes (as before this rule; the choice for
    class preemption is DESIGN's to make, not this one's)."""

    __slots__ = ("_ctx", "_estimate")

    def __init__(self, ctx: CycleContext) -> None:
        self._ctx = ctx
        self._estimate: Callable[[CoreJob], float] | None = None

    def __call__(self, job: CoreJob) -> bool:
        ctx = self._ctx
        reservation = ctx.reservation
        if (
            reservation is None
            or reservation.evicting
            or job is reservation.head
            or job.job_id == reservation.head.job_id
            or job.job_id in reservation.ahead
        ):
            return False
        estimate = self._estimate
        if estimate is None:
            estimate = self._estimate = runtime_estimator(ctx.policy, ctx.state.estimates)
        return kept_off_reserved(ctx.now, reservation.start, estimate, job)


def victim_pool(ctx: CycleContext, book: VictimBook | None) -> VictimPool:
    """The cycle's victim pool: read off the planner's book (else built) the first time a
    phase asks, the same for every phase after (the state does not change within a cycle)."""
    pool = ctx.victim_pool
    if pool is None:
        pool = ctx.victim_pool = (
            VictimPool.build(ctx.state, ctx.now, ctx.policy, ctx.wakeups)
            if book is None
            else book.pool(ctx.state, ctx.now, ctx.wakeups)
        )
    return pool


class ReclaimLandings:
    """The reclaims the preemption phase will plan for jobs waiting in line, foreseen while
    the place phase goes on (core/backfill.py `place`).

    A job within its queue's guarantee that finds no room takes borrowed GPUs back in the
    preemption phase, which comes after placing: the free GPUs its reclaim lands on were
    still free for the jobs behind it in line. A borrower backfilled there in that cycle made
    the reclaim fail, or take others, and was its victim one cycle later: started and
    evicted for a reason the scheduler already knew, the reclaim a cycle late. So the place
    phase plans each such reclaim where the job waits in line, as the preemption phase will
    (the same victims, the same rules, its bounds per cycle), and holds the free GPUs it
    would land on from the jobs behind it, as for a preemptor awaiting its victims; the holds
    are given back before the preemption phase (`Placed.give_back_holds`), which plans again.
    """

    __slots__ = (
        "_attempts",
        "_book",
        "_failed",
        "_head_evicts",
        "_leaving",
        "_planned",
        "_taken",
        "queues",
    )

    def __init__(self, ctx: CycleContext, quota: QuotaBook, book: VictimBook | None) -> None:
        policy = ctx.policy
        # The queues whose waiting jobs may reclaim: those with a guarantee. None (every queue
        # of the bench, of a cluster without guarantees) leaves the place phase as it was.
        self.queues = (
            quota.guaranteed() if policy.preemption and not policy.is_fifo else frozenset()
        )
        self._book = book
        self._taken: set[str] = set()
        self._planned = 0
        self._attempts = 0
        self._failed: dict[tuple[object, ...], int] = {}
        # What the preemption phase's book has taken off each queue by the time it reaches a
        # job in line: the gangs leaving (`credit_leaving`) and the victims of the reclaims
        # planned before (`request_evictions`). The place phase's book has neither (placing
        # reads it as the cycle began), and a reclaim planned on it took a gang of a lender
        # that an earlier reclaim had already brought down to its guarantee: its landing was
        # held for a reclaim the preemption phase refused, cycle after cycle while the first
        # victim checkpointed. Built when a job first gets this far.
        self._leaving: dict[str, GpuAmount] | None = None
        # Whether the head's own reclaim was planned: as in the preemption phase, its
        # reservation then keeps no job behind it off the reserved nodes (`KeptOff`).
        self._head_evicts = False

    def plan(
        self,
        ctx: CycleContext,
        snap: Snapshot,
        job: CoreJob,
        quota: QuotaBook,
        held: Mapping[int, int],
        kept_off: bool = False,
    ) -> list[str]:
        """The gangs the job's reclaim would evict now (none: it reclaims nothing), by the
        preemption phase's rules for it (`preempt`), which plans with `held` (the free GPUs
        held from the jobs behind those ahead, node index -> mask) given back; `kept_off`:
        the backfill rule keeps it off the head's reserved nodes (`KeptOff`)."""
        shape, policy = job.shape, ctx.policy
        kept_off = kept_off and not self._head_evicts
        if (
            shape is None
            or shape.cpu_only
            or self._planned >= MAX_PREEMPTORS_PER_CYCLE
            or self._attempts >= MAX_PREEMPTION_ATTEMPTS
            or job.priority == policy.idle_only_priority
            or ctx.calming(job)
        ):
            return []
        pclass = policy.priority_class(job.priority)
        key = (pclass.rank, job.queue, *shape.failure_key(kept_off))
        if key in self._failed and shape.min_units >= self._failed[key]:
            return []
        pool = victim_pool(ctx, self._book)
        if not pool.size:
            return []
        leaving = self._leaving
        if leaving is None:
            leaving = self._leaving = _leaving(ctx)
        # The book as the preemption phase will read it, for this job alone: put back after
        # (as charged now: a plan adds its victims to `leaving`).
        credited = list(leaving.items())
        for queue, gpus in credited:
            quota.charge(queue, -gpus)
        try:
            if not held:
                return self._plan(ctx, snap, job, shape, pclass, key, pool, quota, kept_off)
            # Idle GPUs serve a preemptor before any eviction does, held or not: planned with
            # the holds taken out, a reclaim that the landing held for a job ahead would serve
            # held the free GPUs beside its victims from the jobs behind, for a reclaim the
            # preemption phase refused ("idle capacity serves"), every cycle while the victims
            # of the job ahead checkpointed.
            with snap.trial():
                for index, mask in held.items():
                    snap.set_free(index, snap.free.get(index, 0) | mask)
                return self._plan(ctx, snap, job, shape, pclass, key, pool, quota, kept_off)
        finally:
            for queue, gpus in credited:
                quota.charge(queue, gpus)

    def _plan(
        self,
        ctx: CycleContext,
        snap: Snapshot,
        job: CoreJob,
        shape: Shape,
        pclass: PriorityClass,
        key: tuple[object, ...],
        pool: VictimPool,
        quota: QuotaBook,
        kept_off: bool,
    ) -> list[str]:
        if not quota.within_guarantee(job.queue, shape.min_gpus):
            return []
        self._attempts += 1
        request = PreemptionRequest(
            preemptor=job,
            shape=shape,
            pclass=pclass,
            reclaiming=True,
            excluded=ctx.released | self._taken,
            now=ctx.now,
            policy=ctx.policy,
            kept_off=kept_off,
        )
        plan = plan_preemption(request, snap, quota, pool)
        if plan is None:
            self._failed[key] = min(self._failed.get(key, shape.min_units), shape.min_units)
            return []
        self._planned += 1
        reservation = ctx.reservation
        if reservation is not None and job.job_id == reservation.head.job_id:
            self._head_evicts = True
        victims = [victim.job_id for victim in plan]
        self._taken.update(victims)
        leaving = self._leaving
        assert leaving is not None
        for victim in plan:
            leaving[victim.queue] = leaving.get(victim.queue, 0) + victim.bound_gpus
        leaving[job.queue] = leaving.get(job.queue, 0) - shape.min_gpus
        return victims


def _leaving(ctx: CycleContext) -> dict[str, GpuAmount]:
    """The GPUs per queue of the gangs leaving soon (`credit_leaving`): those being preempted
    and those this cycle handled, not a walk over every holding gang (3% of the Philly
    window's run). The sums are exact (whole GPUs, fractions): crediting them per queue
    or per gang books the same."""
    leaving: dict[str, GpuAmount] = {}
    state, released = ctx.state, ctx.released
    for job in state.preempting_jobs.values():
        if job.job_id not in released:
            leaving[job.queue] = leaving.get(job.queue, 0) + job.bound_gpus
    holding = state.holding_jobs
    for job_id in ctx.handled:
        handled = holding.get(job_id)
        if handled is not None and handled.state != "preempting" and job_id not in released:
            leaving[handled.queue] = leaving.get(handled.queue, 0) + handled.bound_gpus
    return leaving


@dataclass(frozen=True, slots=True)
class Eviction:
    """Why a preemptor evicts its victims: the words each victim's PreemptionRequested carries,
    its code, what the preemptor waits for (`why` says so) and, optionally, why them."""

    # One text for every victim, or each victim's own (fairness names its service level).
    reason: str | Callable[[CoreJob], str]
    code: PreemptCode
    waiting: str
    because: str = ""


def request_evictions(
    ctx: CycleContext,
    preemptor: CoreJob,
    victims: list[CoreJob],
    eviction: Eviction,
    quota: QuotaBook,
    policy: SchedulingPolicy,
) -> None:
    """Checkpoint-then-evict `victims` for `preemptor`, the one way every preemption is
    recorded: each victim's GPUs leave its queue's usage now (they are on their way out), each
    gets its PreemptionRequested with the policy's grace, and the preemptor's outcome names them."""
    _arrives(ctx, quota, preemptor)  # (`book_arriving` books it in the cycles to come)
    for victim in victims:
        quota.charge(victim.queue, -victim.bound_gpus)
        ctx.emit(
            PreemptionRequested(
                job_id=victim.job_id,
                attempt=victim.attempt,
                preemptor_job_id=preemptor.job_id,
                reason=eviction.reason
                if isinstance(eviction.reason, str)
                else eviction.reason(victim),
                grace_s=policy.preemption_grace_s,
                code=eviction.code,
            )
        )
        ctx.result.preemptions += 1
    names = ", ".join(victim.job_id for victim in victims[:3])
    more = f" and {len(victims) - 3} more" if len(victims) > 3 else ""
    ctx.outcomes[preemptor.job_id] = Outcome(
        "preempting",
        f"{eviction.waiting}; preempting {names}{more}{eviction.because}; starts once they "
        f"checkpoint (within {policy.preemption_grace_s:g} s)",
    )


def is_protected(
    victim: CoreJob, now: float, policy: SchedulingPolicy, wakeups: list[float]
) -> bool:
    """Whether the gang may not be preempted now (adds when that changes to `wakeups`)."""
    if victim.state not in ("running", "reserved"):
        return True
    if not policy.priority_class(victim.priority).preemptible:
        return True
    spec = victim.spec
    if spec is not None and spec.preemptible is False:
        return True
    started = victim.held_since
    min_runtime = spec.min_runtime_s if spec is not None else 0.0
    if started is None or now < started + min_runtime:
        if started is not None:
            wakeups.append(started + min_runtime)
        return True
    if victim.last_preempted_at is not None:
        calm_until = victim.last_preempted_at + policy.hysteresis_s
        if now < calm_until:
            wakeups.append(calm_until)
            return True
    return False


# A gang that may be preempted, beside its place in the pool's order: (class rank, GPUs bound,
# minus the moment it started, seq), unique as it ends in the job's sequence number.
_Order = tuple[int, GpuAmount, float, int]
_Entry = tuple[_Order, CoreJob]
_Group = tuple[str, int]


def _entry(victim: CoreJob, rank: int) -> _Entry:
    return ((rank, victim.bound_gpus, -(victim.held_since or 0.0), victim.seq), victim)


class VictimPool:
    """The gangs that may be preempted at all this cycle, lowest class, smallest, youngest first,
    in groups by (queue, class rank): whether a preemptor may take a gang depends on those two
    alone (and on the quota book, the same for the whole search), so a search walks only the
    groups it may take from, not the whole pool.

    Built once per cycle (`VictimPool.build`, the reference) or read off a planner's
    `VictimBook`, which keeps the groups between cycles; each preemptor then takes borrowers
    first from this order.
    """

    __slots__ = ("groups", "nodes", "size")

    def __init__(
        self, groups: dict[_Group, list[_Entry]], nodes: Sequence[NodeRecord], size: int
    ) -> None:
        # Each group in pool order. Not to be changed while the cycle reads it.
        self.groups = groups
        self.nodes = nodes
        self.size = size

    @classmethod
    def build(
        cls, state: PlanningSurface, now: float, policy: SchedulingPolicy, wakeups: list[float]
    ) -> VictimPool:
        """The pool from every holding gang (adds to `wakeups` when a protection ends)."""
        groups: dict[_Group, list[_Entry]] = {}
        size = 0
        for victim in state.holding_jobs.values():
            if not victim.ranks or is_protected(victim, now, policy, wakeups):
                continue
            rank = policy.priority_class(victim.priority).rank
            groups.setdefault((victim.queue, rank), []).append(_entry(victim, rank))
            size += 1
        for entries in groups.values():
            entries.sort(key=_first)
        return cls(groups, state.node_records, size)

    def reachable(
        self, preemptor: CoreJob, pclass: PriorityClass, reclaiming: bool, quota: QuotaBook
    ) -> Iterator[tuple[bool, str, CoreJob]]:
        """The gangs the preemptor may take, in pool order, each with whether its queue
        borrows and the placement pool of its first rank's node (core/shape.py `pool_of`).
        Across queues only borrowed capacity is taken: a gang within its own queue's
        guarantee is safe from other teams, whatever their class (invariant 4)."""
        borrowing: dict[str, bool] = {}
        taken: list[list[_Entry]] = []
        for (queue, vrank), entries in self.groups.items():
            if not entries:
                continue
            same_queue = queue == preemptor.queue
            borrower = borrowing.get(queue)
            if borrower is None:
                borrower = borrowing[queue] = not same_queue and quota.borrowing(queue) > 0
            if not (same_queue or borrower):
                continue
            if (pclass.can_preempt and vrank < pclass.rank) or (reclaiming and borrower):
                taken.append(entries)
        nodes = self.nodes
        # The groups' sorted runs merged in C, all at once as the built pool sorted its
        # positions: a search may walk thousands of entries, where a lazy merge in Python
        # cost more than it saved. Orders are unique (they end in the seq).
        merged = taken[0] if len(taken) == 1 else sorted(chain.from_iterable(taken), key=_first)
        for _, victim in merged:
            yield borrowing[victim.queue], nodes[victim.ranks[0][0]].pool, victim


class VictimBook(StateIndex[HoldingWatch]):
    """One state's victim pool kept between cycles by its planner (`VictimPool.build` is the
    reference it is tested against).

    Which holding gangs may be preempted changes with the gangs (the state's holding watch
    says which entered, changed state or left: a new binding, a start, a preemption) and with
    the clock alone in one way: a gang protected for its minimum runtime or its hysteresis
    window is free once that moment comes. Such gangs wait in a heap by that moment and are
    looked at again when it comes (a gang still calming after its minimum runtime goes back
    with its calm's end). What `is_protected` says of a gang at `now` rests on those alone,
    its class under the policy (a new policy builds the book again) and its spec, which does
    not change while it holds a gang. The wake-up noted is the earliest moment a protection
    ends, not one per gang, in the cycles that ask for the pool, as when it is built.
    """

    __slots__ = ("_calm", "_groups", "_next", "_size", "_token", "_where")

    def __init__(self) -> None:
        super().__init__()
        self._groups: dict[_Group, list[_Entry]] = {}
        # A kept gang's group and order.
        self._where: dict[str, tuple[_Group, _Order]] = {}
        self._size = 0
        # (moment its protection ends, token, job id); stale entries (the gang changed since:
        # another token) are dropped when they reach the top.
        self._calm: list[tuple[float, int, str]] = []
        self._token: dict[str, int] = {}
        self._next = 0

    def pool(self, state: PlanningSurface, now: float, wakeups: list[float]) -> VictimPool:
        """What `VictimPool.build(state, now, state.policy, wakeups)` gives, from the book."""
        self.sync(state, now)
        calm, token = self._calm, self._token
        while calm and token.get(calm[0][2]) != calm[0][1]:
            heapq.heappop(calm)
        if calm:
            wakeups.append(calm[0][0])
        return VictimPool(self._groups, state.node_records, self._size)

    def sync(self, state: PlanningSurface, now: float) -> None:
        """Up to date with `state` at `now` (called every cycle, so that the watch's changes
        never pile up while no cycle preempts)."""
        watch = self._current(state, now)
        holding = state.holding_jobs
        if watch is None:
            self._bind(state, state.watch_holding(), type(state).unwatch_holding)
            self._groups = {}
            self._where = {}
            self._size = 0
            self._calm = []
            self._token = {}
            self._take(holding.values(), now)
        elif watch.changes:
            changes, watch.changes = watch.changes, []
            ids = dict.fromkeys(job_id for job_id, _ in changes)
            for job_id in ids:
                self._drop(job_id)
            self._take([holding[job_id] for job_id in ids if job_id in holding], now)
        calm, token = self._calm, self._token
        due: list[CoreJob] = []
        while calm and calm[0][0] <= now:
            _, entry_token, job_id = heapq.heappop(calm)
            if token.get(job_id) == entry_token:
                del token[job_id]
                due.append(holding[job_id])
        if due:
            self._take(due, now)
        if len(calm) > 2 * len(token) + 1024:
            self._calm = [entry for entry in calm if token.get(entry[2]) == entry[1]]
            heapq.heapify(self._calm)

    def _drop(self, job_id: str) -> None:
        self._token.pop(job_id, None)
        kept = self._where.pop(job_id, None)
        if kept is not None:
            group = self._groups[kept[0]]
            del group[bisect_left(group, kept[1:])]
            self._size -= 1

    def _take(self, jobs: Iterable[CoreJob], now: float) -> None:
        """Keep these holding gangs (none of them kept now): in their group when they may be
        preempted now, in the heap when a protection of theirs ends later."""
        policy = self._policy
        fresh: dict[_Group, list[_Entry]] = {}
        moments: list[float] = []
        for victim in jobs:
            if not victim.ranks:
                continue
            if is_protected(victim, now, policy, moments):
                if moments:
                    self._next += 1
                    job_id = victim.job_id
                    self._token[job_id] = self._next
                    heapq.heappush(self._calm, (moments.pop(), self._next, job_id))
                continue
            rank = policy.priority_class(victim.priority).rank
            name = (victim.queue, rank)
            entry = _entry(victim, rank)
            self._where[victim.job_id] = (name, entry[0])
            fresh.setdefault(name, []).append(entry)
            self._size += 1
        merge_sorted(self._groups, fresh)


@dataclass(frozen=True, slots=True)
class PreemptionRequest:
    """One waiting job's claim to evict others, and on which grounds."""

    preemptor: CoreJob
    shape: Shape
    pclass: PriorityClass
    # Its queue stays within its guarantee: it may take back what other queues borrow.
    reclaiming: bool
    # Gangs already released or chosen this cycle.
    excluded: Set[str]
    now: float
    policy: SchedulingPolicy
    # The backfill rule keeps it off the head's reserved nodes (core/reservation.py
    # `kept_off_reserved`): the idle GPUs there do not serve it (its victims' GPUs do).
    kept_off: bool = False


def plan_preemption(
    request: PreemptionRequest, snap: Snapshot, quota: QuotaBook, pool: VictimPool
) -> list[CoreJob] | None:
    """The whole gangs to evict so that the preemptor fits, or None (then nobody is evicted)."""
    shape, preemptor, pclass = request.shape, request.preemptor, request.pclass
    reclaiming, excluded = request.reclaiming, request.excluded
    now, policy = request.now, request.policy
    # Queues on the preemptor's chain the gang would take past their max: evictions under
    # them must make that room too (a sibling's borrowing may fill a parent's ceiling).
    excess = quota.excess(preemptor.queue, shape.min_gpus)
    kept_off = request.kept_off
    idle_serves = find_placement(snap, shape, kept_off) is not None
    if idle_serves and not excess:
        # Idle capacity serves (a reservation held it back, and it may backfill onto the
        # reserved GPUs, or quota did): never preempt.
        return None
    borrowers: list[CoreJob] = []
    everyone: list[CoreJob] = []
    # Gangs that make the preemptor no room (GPUs of another type, or of a pool it may not
    # use) but give a full ceiling back some: a sibling's borrowing in another pool fills the
    # parent's max as surely. (borrowers, the others)
    spare: tuple[list[CoreJob], list[CoreJob]] = ([], [])
    for borrower, victim_pool, victim in pool.reachable(preemptor, pclass, reclaiming, quota):
        if len(everyone) >= MAX_CANDIDATES and len(borrowers) >= MAX_CANDIDATES:
            break
        if victim.job_id in excluded or victim.job_id == preemptor.job_id:
            continue
        if not pool_suits(shape, victim_pool):
            if excess and victim.bound_gpus and len(spare[0]) + len(spare[1]) < MAX_CANDIDATES:
                spare[0 if borrower else 1].append(victim)
            continue
        if not victim.bound_gpus and not shape.asks_host:
            continue  # a CPU-only gang frees nothing a gang of GPUs alone could use
        if not shape.asks_host and not any(mask for _, mask in victim.ranks):
            continue  # slices and shares free no whole GPU (core/share_preemption.py)
        if borrower and len(borrowers) < MAX_CANDIDATES:
            borrowers.append(victim)
        if len(everyone) < MAX_CANDIDATES:
            everyone.append(victim)
    if preemptor.priority == policy.inference_class:
        # Bounded blast radius, the least lost work first (core/slo.py).
        borrowers = bounded_victims(borrowers, now, policy)
        everyone = bounded_victims(everyone, now, policy)
    # Borrowers first: within the everyone tier, too, a borrower outranks a lender.
    borrowing = {v.job_id for v in borrowers}
    everyone.sort(key=lambda v: 0 if v.job_id in borrowing else 1)
    # Each tier, and what it may take beyond its own for quota room alone, borrowers first.
    tiers = [(borrowers, spare[0]), (everyone, [*spare[0], *spare[1]])]
    if idle_serves:
        # Only quota is short: the fewest gangs that give the ceilings back their room.
        for victims, other in tiers:
            chosen = _quota_room(quota, excess, [*victims, *other], [])
            if chosen is not None:
                return chosen
        return None
    if snap.total_free + sum(v.bound_gpus for v in everyone) < shape.min_gpus:
        return None
    if excess:
        # Gangs under the full ceilings first: their GPUs make room in both senses.
        tiers = [
            (subset, other)
            for tier, other in tiers
            for subset in (_under(quota, excess, tier), tier)
        ]
    reserved = snap.reserved
    with snap.trial() as planning:
        planning.reserved = frozenset()
        if kept_off:
            # The idle GPUs of the head's reserved nodes are none of its room; those its
            # victims there free are (it goes first once they are gone: core/ordering.py).
            for index in reserved:
                if index in planning.free:
                    planning.set_free(index, 0)
        for victims, other in tiers:
            if not victims:
                continue
            for some in _off_reserved_first(victims, reserved) if kept_off else (victims,):
                chosen = search_victims(planning, shape, some)
                if chosen is not None and excess:
                    chosen = _quota_room(quota, excess, [*victims, *other], chosen)
                if chosen is not None:
                    return chosen
        return None


def _off_reserved_first(
    victims: list[CoreJob], reserved: frozenset[int]
) -> tuple[list[CoreJob], ...]:
    """The victims a reclaimer kept off the reserved nodes searches, in turn: those with no
    rank there (it reclaims elsewhere, the head's start stays), then all of them (only when
    nothing elsewhere suffices does it take borrowed GPUs on the head's nodes: invariant 4
    before the reservation). Both within one tier, so that borrowers still go first."""
    elsewhere = [v for v in victims if not any(index in reserved for index, _ in v.ranks)]
    if not elsewhere:
        return (victims,)
    if len(elsewhere) == len(victims):
        return (elsewhere,)
    return (elsewhere, victims)


def _under(quota: QuotaBook, excess: dict[str, GpuAmount], victims: list[CoreJob]) -> list[CoreJob]:
    """The victims whose eviction gives room under a queue of `excess`."""
    return [v for v in victims if any(queue in excess for queue in quota.chain(v.queue))]


def _quota_room(
    quota: QuotaBook, excess: dict[str, GpuAmount], victims: list[CoreJob], chosen: list[CoreJob]
) -> list[CoreJob] | None:
    """`chosen` and the fewest more victims under the queues in `excess` whose eviction brings
    each back within its max, or None: the first that alone suffices, else victims in order,
    less those the later ones made unnecessary."""

    def short(taken: list[CoreJob]) -> bool:
        freed: dict[str, GpuAmount] = dict.fromkeys(excess, 0)
        for victim in taken:
            for queue in quota.chain(victim.queue):
                if queue in freed:
                    freed[queue] += victim.bound_gpus
        return any(freed[queue] < over for queue, over in excess.items())

    if not short(chosen):
        return chosen
    taken = {victim.job_id for victim in chosen}
    others = [victim for victim in _under(quota, excess, victims) if victim.job_id not in taken]
    for victim in others:
        if not short([*chosen, victim]):
            return [*chosen, victim]
    added: list[CoreJob] = []
    for victim in others:
        added.append(victim)
        if not short([*chosen, *added]):
            break
    else:
        return None
    for victim in list(added):
        rest = [other for other in added if other is not victim]
        if not short([*chosen, *rest]):
            added = rest
    return [*chosen, *added]


def _fits(planning: Snapshot, shape: Shape, victims: list[CoreJob]) -> Allocation | None:
    """Where the preemptor would land were the victims gone (their GPUs, CPUs and memory)."""
    # (Victims chosen node by node may hold thousands of ranks.)
    with planning.trial_releasing(sum(len(victim.ranks) for victim in victims)):
        for victim in victims:
            release_gang(planning, victim)
        if planning.total_free < shape.min_gpus:
            return None
        return find_placement(planning, shape, False)


def _single(planning: Snapshot, shape: Shape, victims: list[CoreJob]) -> list[CoreJob] | None:
    """The first single gang (in victim order) whose eviction alone suffices."""
    tries = 0
    free = planning.total_free
    for victim in victims:
        if free + victim.bound_gpus < shape.min_gpus:
            continue
        tries += 1
        if _fits(planning, shape, [victim]) is not None:
            return [victim]
        if tries >= MAX_TRIES:
            break
    return None


# Node index -> the victims' gangs with ranks there and the GPUs each holds there, in victim order.
OnNode = dict[int, list[tuple[CoreJob, int]]]


def search_victims(
    planning: Snapshot, shape: Shape, victims: list[CoreJob]
) -> list[CoreJob] | None:
    """The victims (in their order of preference) to evict so that the shape fits, or None:
    a single gang, else chosen node by node, else greedily. A set of victims that could not
    make room even all evicted together is passed over before the searches that release
    them: a 4,096-GPU gang facing a few hundred scattered victims released them all, node by
    node and then greedily, only to learn that (a third of a busy cycle late in a long run,
    docs/benchmarks.md)."""
    chosen = _single(planning, shape, victims)
    if chosen is not None:
        return chosen
    on_node = _on_node(victims)
    if _units_at_most(planning, shape, on_node) < shape.min_units:
        return None
    return _by_node(planning, shape, on_node) or _greedy(planning, shape, victims)


def _on_node(victims: list[CoreJob]) -> OnNode:
    on_node: OnNode = {}
    for victim in victims:
        for index, mask in victim.ranks:
            on_node.setdefault(index, []).append((victim, popcount(mask)))
    return on_node


def _units_at_most(planning: Snapshot, shape: Shape, on_node: OnNode) -> int:
    """The most whole units the shape could find were every victim gone: each node's free
    GPUs with the victims' there (a gang's GPUs are never free, so they add up). An upper bound:
    it counts no host, health or topology limit."""
    unit = shape.unit_gpus
    count = planning.count
    units = _free_units(planning, shape)
    for index, held in on_node.items():
        free = count.get(index, 0)
        units += (free + sum(here for _, here in held)) // unit - free // unit
    return units


def _by_node(planning: Snapshot, shape: Shape, on_node: OnNode) -> list[CoreJob] | None:
    """Victims chosen node by node: the nodes that evictions free most cheaply first.

    A gang's units each need one node. Small victims taken in pool order are scattered over
    the cluster and may free no node whole while plenty of nodes hold only victims (a team
    reclaiming 8 GPUs from borrowers' 1-GPU jobs); so here each node's own victims are weighed
    together: on each node, victims in pool order until it offers one unit more, then the
    nodes with the fewest GPUs evicted per unit gained until the gang's units are covered.
    A node's victims may free more than one unit (an 8-GPU gang frees two units of 4): each
    option counts the units it gains, and the placement of the victims chosen is the judge
    (a gang of victims on several nodes frees units the count does not see). Counted as one
    unit per node, a choice that sufficed was dropped for the greedy phase, which evicted a
    further gang.
    """
    unit = shape.unit_gpus
    options: list[tuple[GpuAmount, int, list[CoreJob], int]] = []
    for index in sorted(on_node):
        free = planning.count.get(index, 0)
        gained = free
        taken: dict[str, CoreJob] = {}
        for victim, here in on_node[index]:
            if victim.job_id not in taken:
                taken[victim.job_id] = victim
                gained += here
                if gained // unit > free // unit:
                    break
        if gained // unit > free // unit:
            evicted = sum(victim.bound_gpus for victim in taken.values())
            units = gained // unit - free // unit
            options.append((evicted, index, list(taken.values()), units))
    options.sort(key=lambda option: (option[0], option[1]))
    covered = _free_units(planning, shape)
    chosen: dict[str, CoreJob] = {}
    for _, _, taken_here, units in options:
        if covered >= shape.min_units:
            break
        for victim in taken_here:
            chosen.setdefault(victim.job_id, victim)
        covered += units
    if not chosen:
        return None
    victims_chosen = list(chosen.values())
    allocation = _fits(planning, shape, victims_chosen)
    if allocation is None:
        return None
    return _landed_on(planning, shape, victims_chosen, allocation)


def _landed_on(
    planning: Snapshot, shape: Shape, chosen: list[CoreJob], allocation: Allocation
) -> list[CoreJob]:
    """Of the victims whose eviction lets the preemptor fit, those it lands on, if they
    alone suffice; else all of them."""
    landing = {index for index, _ in allocation}
    needed = [v for v in chosen if any(index in landing for index, _ in v.ranks)]
    if needed != chosen and _fits(planning, shape, needed) is not None:
        return needed
    return chosen


def _free_units(planning: Snapshot, shape: Shape) -> int:
    """Units the free GPUs already offer, node by node, in the shape's pool(s)."""
    pools = shape_pools(shape, planning.levels)
    unit = shape.unit_gpus
    units = 0
    for pool in pools:
        for count, nodes in enumerate(planning.levels.get(pool, ())):
            units += len(nodes) * (count // unit)
    return units


def _greedy(planning: Snapshot, shape: Shape, victims: list[CoreJob]) -> list[CoreJob] | None:
    """Add gangs in victim order until the preemptor fits, then keep only those it lands on.

    The victims are released into one trial as they are added, not all again at each try
    (`_fits` per try made a wide gang's search quadratic in its victims); placement reads
    the snapshot's content only, so each try finds what `_fits(planning, shape, chosen)` would.
    """
    chosen: list[CoreJob] = []
    tries = 0
    free = planning.total_free
    freed: GpuAmount = 0  # sum(v.bound_gpus for v in chosen), added in the same order
    allocation: Allocation | None = None
    with planning.trial():
        for victim in victims:
            chosen.append(victim)
            release_gang(planning, victim)
            freed += victim.bound_gpus
            if free + freed < shape.min_gpus:
                continue
            tries += 1
            if planning.total_free >= shape.min_gpus:
                allocation = find_placement(planning, shape, False)
                if allocation is not None:
                    break
            if tries >= MAX_TRIES:
                break
    if allocation is None:
        return None
    return _landed_on(planning, shape, chosen, allocation)
