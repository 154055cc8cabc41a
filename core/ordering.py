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

import heapq
import math
from bisect import bisect_left, bisect_right
from collections.abc import Iterable
from datetime import UTC, datetime
from operator import attrgetter, itemgetter

from core.attained import attained_service, service_level
from core.context import CycleContext, Outcome
from core.drf import dominant_usage
from core.live_sharing import GpuAmount
from core.policy import SchedulingPolicy
from core.quota import QuotaBook
from core.reservation import runtime_estimate
from core.state import CoreJob, HostCapacity, QueueRecord, WaitingWatch
from core.state_index import StateIndex, merge_sorted
from core.surface import PlanningSurface
from schemas.reasons import DEFER_CODES, NOT_CONSIDERED, RESERVED_HEAD, RETRY_BACKOFF

# Smaller sorts first. The first element is the tier; keys of one tier have one shape, and
# keys of different tiers are told apart by it.
OrderKey = tuple[float, ...]
_first = itemgetter(0)
_seq = attrgetter("seq")


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


def order(ctx: CycleContext, quota: QuotaBook, kept: OrderBook | None = None) -> list[CoreJob]:
    """Phase 3 of the cycle: the waiting jobs not yet handled, first to be placed first.

    With `kept` (a planner's), the order kept between cycles (`OrderBook`); without, every
    job keyed and sorted afresh (the reference the book is tested against)."""
    state, policy = ctx.state, ctx.policy
    if policy.order_key is not None:
        candidates = [job for job in state.waiting_jobs.values() if job.job_id not in ctx.handled]
        ctx.result.considered = len(candidates)
        order_key = policy.order_key
        candidates.sort(key=lambda job: (order_key(job.job_id), job.seq))
        return candidates
    if policy.is_fifo:
        candidates = [job for job in state.waiting_jobs.values() if job.job_id not in ctx.handled]
        ctx.result.considered = len(candidates)
        candidates.sort(key=lambda job: job.seq)  # strict arrival order
        return candidates
    if kept is not None:
        return kept.order(ctx, quota)
    candidates = [job for job in state.waiting_jobs.values() if job.job_id not in ctx.handled]
    ctx.result.considered = len(candidates)
    keyed = _keyed(ctx, quota, candidates)
    # Keys are unique (they end in the job's sequence number): the jobs are never compared.
    keyed.sort(key=_first)
    return [job for _, job in keyed]


def _keyed(
    ctx: CycleContext, quota: QuotaBook, jobs: Iterable[CoreJob]
) -> list[tuple[OrderKey, CoreJob]]:
    """Each job's key (`gangway_key`), each job not yet aged noting its aging wake-up."""
    state, policy, now = ctx.state, ctx.policy, ctx.now
    queues = state.queue_records
    capacity = state.host_capacity()
    aging = policy.aging_max_wait_s
    wakeups = ctx.wakeups
    # What many jobs share is asked once per call: a queue's share and guarantee, a class's
    # rank, whether a queue stays within its guarantee with a job's GPUs (the book does not
    # change while ordering), the level of an amount of service. A busy cycle orders 10,000
    # jobs of 20 queues, 4 classes and a few sizes.
    shares: dict[str, tuple[float, bool]] = {}
    ranks: dict[str, int] = {}
    within_of: dict[tuple[str, GpuAmount], bool] = {}
    levels: dict[float, int] = {}
    keyed: list[tuple[OrderKey, CoreJob]] = []
    for job in jobs:
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
    return keyed


# A group's jobs in order, each beside the rest of its key: (level, 0, submitted, seq).
_Entry = tuple[tuple[float, ...], CoreJob]
_second = itemgetter(1)


class OrderBook(StateIndex[WaitingWatch]):
    """The waiting jobs of one state kept in order between cycles, by its planner.

    In a queue without a guarantee a job that waits, not aged, awaiting no victims and holding
    no ranks, has the key (2, 1, -rank, share, level, 0, submitted, seq): its class and queue
    give the first four, the same for all their jobs, and the rest is fixed while it waits. The
    book keeps such jobs per (queue, class) sorted by the rest, as the state says which jobs
    entered, left or changed (`watch_waiting`); a cycle orders the groups by their first four
    (a queue's share moves with the clock), merges groups that tie, and keys one by one only
    the others: aged jobs (a heap of the moments they age), jobs awaiting victims or holding
    ranks, and the jobs of queues with a guarantee (within it, a job's predicted length
    orders it). The aging wake-up noted is the earliest one, not one per job.
    """

    __slots__ = ("_aged", "_aging", "_groups", "_heap", "_loose", "_where")

    def __init__(self) -> None:
        super().__init__()
        self._aging = 0.0
        # (queue, class) → its kept jobs in order.
        self._groups: dict[tuple[str, str], list[_Entry]] = {}
        # A kept job's group, the rest of its key and the moment it began waiting.
        self._where: dict[str, tuple[tuple[str, str], tuple[float, ...], float]] = {}
        # (queued_at, seq, job id) of every kept job, earliest first; stale entries (the job
        # gone, aged or queued again since) are dropped when they reach the top.
        self._heap: list[tuple[float, int, str]] = []
        # Jobs moved out of their group once aged: job id → (its key (1, queued_at, seq), job).
        self._aged: dict[str, tuple[OrderKey, CoreJob]] = {}
        # Waiting jobs keyed in every cycle: awaiting victims, holding ranks, or never queued.
        self._loose: dict[str, CoreJob] = {}

    def order(self, ctx: CycleContext, quota: QuotaBook) -> list[CoreJob]:
        """What `order` gives without a book, from the kept groups."""
        state, policy, now = ctx.state, ctx.policy, ctx.now
        self._sync(state, now)
        waiting = state.waiting_jobs
        skipped = {job_id for job_id in ctx.handled if job_id in waiting}
        ctx.result.considered = len(waiting) - len(skipped)
        self._age(now)
        self._note_wakeup(ctx, skipped)
        queues = state.queue_records
        capacity = state.host_capacity()
        # Keyed one by one: the loose jobs and the jobs of queues with a guarantee.
        single = [job for job_id, job in self._loose.items() if job_id not in skipped]
        segments: list[tuple[OrderKey, list[_Entry]]] = []
        for (queue, priority), entries in self._groups.items():
            if not entries:
                continue
            if quota.guarantee(queue) > 0:
                single.extend(job for _, job in entries if job.job_id not in skipped)
                continue
            share = fair_share(queues.get(queue), now, policy, capacity)
            rank = policy.priority_class(priority).rank
            segments.append(((2, 1, -rank, share), entries))
        keyed = _keyed(ctx, quota, single)
        keyed.extend(entry for job_id, entry in self._aged.items() if job_id not in skipped)
        keyed.sort(key=_first)
        ordered: list[CoreJob] = []
        at = 0
        while at < len(keyed) and keyed[at][0][0] < 2:
            ordered.append(keyed[at][1])
            at += 1
        # The rest of those keyed one by one are of tier 2: a segment per prefix, as a group.
        while at < len(keyed):
            prefix = keyed[at][0][:4]
            segment: list[_Entry] = []
            while at < len(keyed) and keyed[at][0][:4] == prefix:
                segment.append((keyed[at][0][4:], keyed[at][1]))
                at += 1
            segments.append((prefix, segment))
        segments.sort(key=_first)
        start = 0
        while start < len(segments):
            prefix = segments[start][0]
            end = start + 1
            while end < len(segments) and segments[end][0] == prefix:
                end += 1
            if end == start + 1:
                ordered.extend(map(_second, segments[start][1]))
            else:
                # Groups whose prefixes tie (queues of one share and class): merged by the rest
                # of the key, unique as it ends in the job's sequence number.
                merged = heapq.merge(*(entries for _, entries in segments[start:end]))
                ordered.extend(map(_second, merged))
            start = end
        if skipped:
            ordered = [job for job in ordered if job.job_id not in skipped]
        return ordered

    # ------------------------------------------------------------ upkeep

    def _sync(self, state: PlanningSurface, now: float) -> None:
        watch = self._current(state, now)
        if watch is None:
            # Another state, a new policy, or the clock went back (aged jobs may not be any
            # more): build again from the state.
            self._rebuild(state)
        elif watch.changed:
            changed = watch.changed
            watch.changed = {}
            waiting = state.waiting_jobs
            # A job the book does not keep yet (a burst's ~9,400 new jobs) has nothing to
            # remove: only those it keeps are looked for, found in C.
            for kept in (self._where, self._loose, self._aged):
                if kept:
                    for job_id in changed.keys() & kept.keys():
                        self._remove(job_id)
            added = [waiting[job_id] for job_id in changed if job_id in waiting]
            # In arrival order: a burst's arrivals enter each group as one sorted run (their
            # keys end in level, submission and seq, all rising with seq for jobs not yet
            # served), merged with the group's in one pass, not sorted among themselves.
            added.sort(key=_seq)
            self._add(added)
        if len(self._heap) > 2 * len(self._where) + 32:
            self._heap = [entry for entry in self._heap if self._kept(entry[2], entry[0])]
            heapq.heapify(self._heap)

    def _rebuild(self, state: PlanningSurface) -> None:
        self._bind(state, state.watch_waiting(), type(state).unwatch_waiting)
        self._aging = state.policy.aging_max_wait_s
        self._groups = {}
        self._where = {}
        self._heap = []
        self._aged = {}
        self._loose = {}
        self._add(list(state.waiting_jobs.values()))

    def _add(self, jobs: list[CoreJob]) -> None:
        """Keep these waiting jobs (none of them kept now)."""
        policy, where, loose = self._policy, self._where, self._loose
        levels: dict[float, int] = {}
        fresh: dict[tuple[str, str], list[_Entry]] = {}
        moments: list[tuple[float, int, str]] = []
        # Lookups bound once: a burst's first cycle adds ~10,000 jobs here.
        level_of, entries_of, note = levels.get, fresh.get, moments.append
        for job in jobs:
            queued_at = job.queued_at
            job_id = job.job_id
            if job.awaiting_victims or job.ranks or queued_at is None:
                loose[job_id] = job
                continue
            service = job.attained_gpu_s
            level = level_of(service)
            if level is None:
                level = levels[service] = service_level(service, policy)
            seq = job.seq
            rest = (level, 0, job.submitted_at or 0.0, seq)
            name = (job.queue, job.priority)
            where[job_id] = (name, rest, queued_at)
            entries = entries_of(name)
            if entries is None:
                fresh[name] = [(rest, job)]
            else:
                entries.append((rest, job))
            note((queued_at, seq, job_id))
        merge_sorted(self._groups, fresh)
        heap = self._heap
        if 8 * len(moments) > len(heap):
            heap.extend(moments)
            heapq.heapify(heap)
        else:
            for moment in moments:
                heapq.heappush(heap, moment)

    def _remove(self, job_id: str) -> None:
        if self._loose.pop(job_id, None) is not None or self._aged.pop(job_id, None) is not None:
            return
        kept = self._where.pop(job_id, None)
        if kept is not None:
            group = self._groups[kept[0]]
            del group[bisect_left(group, kept[1:2])]

    def _kept(self, job_id: str, queued_at: float) -> bool:
        """Whether a heap entry is the job's as it waits now, in its group."""
        kept = self._where.get(job_id)
        return kept is not None and kept[2] == queued_at

    def _age(self, now: float) -> None:
        """Move the jobs aged by `now` out of their groups (the same test as `is_aged`)."""
        heap, aging = self._heap, self._aging
        while heap:
            queued_at, seq, job_id = heap[0]
            if not self._kept(job_id, queued_at):
                heapq.heappop(heap)
                continue
            if not now - queued_at >= aging:
                return
            heapq.heappop(heap)
            name, rest, _ = self._where.pop(job_id)
            group = self._groups[name]
            at = bisect_left(group, (rest,))
            self._aged[job_id] = ((1, queued_at, seq), group[at][1])
            del group[at]

    def _note_wakeup(self, ctx: CycleContext, skipped: set[str]) -> None:
        """The earliest moment a kept job not handled this cycle ages (the heap's top is
        current after `_age`)."""
        heap = self._heap
        if not heap:
            return
        if not skipped:
            ctx.wakeups.append(heap[0][0] + self._aging)
            return
        wanted = len(skipped) + 1
        while True:
            for queued_at, _, job_id in heapq.nsmallest(wanted, heap):
                if job_id not in skipped and self._kept(job_id, queued_at):
                    ctx.wakeups.append(queued_at + self._aging)
                    return
            if wanted >= len(heap):
                return
            wanted *= 2


# The reasons a cycle gives a waiting job it has considered. A job waiting with any other (the
# state's, given when it began waiting: admission's or a resume's "queued", a requeue's code;
# none, once a hold or its release forgot the last) or with the bound's own has no reason of
# this cycle's worth keeping when the cycle does not consider it.
_CONSIDERED: frozenset[str | None] = frozenset(DEFER_CODES - {NOT_CONSIDERED})


def within_depth(ctx: CycleContext, waiting: list[CoreJob]) -> list[CoreJob]:
    """The waiting jobs (in order) this cycle considers: all of them up to the first newly
    queued one past the policy's `max_new_jobs_per_cycle`; that one and every job behind it
    wait for the next cycle (`ctx.result.not_considered` of them), which follows at once.

    Newly queued: not considered by a cycle since it began waiting (admitted, resumed,
    requeued: `CoreJob.considered`). The bound counts those, whose first placement, reason and
    preemption search are a flood's cost (a burst of ~9,400 arrivals cost one busy cycle
    ~90 ms); jobs considered before cost little again. It cuts the order, never skips within
    it: no job is considered while one ahead of it is not, so a high class arriving behind a
    flood of a lower one goes first in the very next cycle, no job behind the cut takes
    capacity a job ahead of it could use, and the head (the first job that cannot start,
    holding the reservation) is always a considered job. Each cycle considers
    `max_new_jobs_per_cycle` more newcomers, so N arrivals are all considered within
    ceil(N / bound) cycles.

    Behind the cut, a job whose reason is not a cycle's, and one that was the head (its
    reservation is another's now), get `NOT_CONSIDERED` (invariant 5: every waiting job has
    a recorded reason); the others keep the reason the last cycle that considered them gave.
    A head so displaced stays considered (it was, since it began waiting): it takes no
    newcomer's place, and a flood of N arrivals is considered within ceil(N / bound) cycles
    whatever it displaces.
    """
    limit = ctx.policy.max_new_jobs_per_cycle
    if len(waiting) <= limit:
        return waiting
    cut = _cut(waiting, limit)
    if cut is None:
        return waiting
    beyond = waiting[cut:]
    ctx.result.not_considered = len(beyond)
    why = (
        f"not yet considered: a cycle considers at most {limit} newly queued jobs, "
        "and as many were ahead of it in line"
    )
    considered, outcomes = _CONSIDERED, ctx.outcomes
    # One outcome per need, shared by its jobs (an outcome is never changed once given): a
    # flood's first cycle gives ~7,400 jobs this reason, of a few needs.
    made: dict[str, Outcome] = {}
    for job in beyond:
        code = job.reason_code
        if code not in considered or code == RESERVED_HEAD:
            need = job.need
            outcome = made.get(need)
            if outcome is None:
                outcome = made[need] = Outcome(NOT_CONSIDERED, f"{need}; {why}")
            outcomes[job.job_id] = outcome
    return waiting[:cut]


def _cut(waiting: list[CoreJob], limit: int) -> int | None:
    """The position of the first newly queued job past `limit` of them, or None."""
    new = 0
    for at, job in enumerate(waiting):
        if not job.considered:
            new += 1
            if new > limit:
                return at
    return None


def past_backoff(ctx: CycleContext, waiting: list[CoreJob]) -> list[CoreJob]:
    """The waiting jobs free to start now; one still in its retry backoff says until when
    (its reason, shown by `why`) and the cycle wakes then."""
    if ctx.state.latest_retry_at <= ctx.now:
        return waiting  # (a busy cycle passes ~10,000 waiting jobs, seldom one in its backoff)
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
        )
    return ready


def _when_s(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
