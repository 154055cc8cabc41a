"""EASY backfill: the head gang's earliest start, on concrete nodes, from running gangs' ends."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from datetime import UTC, datetime
from functools import partial
from itertools import groupby
from operator import itemgetter
from typing import TypeVar

from core.context import CycleContext, HeadReservation, Outcome
from core.estimates import RuntimeEstimates
from core.placement import Allocation, Shape, Snapshot, find_placement
from core.policy import SchedulingPolicy
from core.state import CoreJob, HeldGang, rank_host
from schemas.jobs import JobSpec, ReservationPlanned
from schemas.reasons import RESERVED_HEAD

# Trying a placement after every released gang would cost a placement per running job; after
# this many failed tries, try again only once a further 1/8 of the need has been freed.
EAGER_TRIES = 16
# A century: the longest a gang is planned to hold its GPUs. Plans become timestamps (reasons,
# ReservationPlanned), and an estimate past any clock (a recorded 1e308 s, or a ten-year
# estimate times a team's learned ratio) made every cycle fail with an OverflowError.
MAX_PLANNED_RUNTIME_S = 100 * 366 * 86_400

_J = TypeVar("_J")


def runtime_estimate(
    job: CoreJob, policy: SchedulingPolicy, estimates: RuntimeEstimates | None = None
) -> float:
    """How long the job's gang is expected to hold its GPUs: the one rule for backfill (does a
    job end before the head's start?) and for reservations (when does a running gang end?).

    - what `estimates` learned from the log (core/estimates.py), when the policy learns
      runtimes and there is something to go by: the user's `estimated_runtime_s` scaled by how
      far the team's estimates were off, else the runtime of jobs like it, capped by
      `max_runtime_s`;
    - `estimated_runtime_s` when given: a hint, never a limit, but capped by `max_runtime_s`,
      since the job is ended there whatever it estimated;
    - else `max_runtime_s` when given: the only bound the user stated, and a safe one (the
      gang cannot hold its GPUs longer), as EASY backfill uses the time limit;
    - else the policy's `default_runtime_estimate_s`.

    Both phases must agree: were a gang with only a limit counted short in the reservation
    plan but long when it backfills, a reservation would be planned on GPUs still held.
    Whatever the source, it is at most MAX_PLANNED_RUNTIME_S.
    """
    if estimates is None or not policy.learned_runtimes:
        return _unlearned(policy, job)
    return _kept(policy, estimates, _kept_estimates(policy, estimates), job)


def kept_off_reserved(
    now: float, head_start: float | None, runtime: Callable[[_J], float], job: _J
) -> bool:
    """The backfill rule (DESIGN §3), the one definition of it: whether the head's reserved
    nodes are closed to a job behind the head, i.e. it would not end before the head's planned
    start (`runtime(job)` from `now`; asked only when the head has a start). Such a job:

    - is placed only off the reserved nodes (core/backfill.py `place`);
    - is not served by the idle GPUs there: the preemption planner does not count them as
      capacity that serves it, so a job within its queue's guarantee reclaims borrowed GPUs
      elsewhere (core/preemption.py `plan_preemption`, invariant 4) instead of waiting as
      long as the head does; the idle GPUs there still serve a job that may backfill onto
      them, which evicts no one;
    - is judged so by the auditor's idle_capacity and borrowers_first rules (core/audit.py),
      from the reservation the cycle recorded.

    A job ahead of the head (placed before the head was found) is no job behind it: the
    callers tell which is which.
    """
    return head_start is None or now + runtime(job) > head_start


def runtime_estimator(
    policy: SchedulingPolicy, estimates: RuntimeEstimates | None
) -> Callable[[CoreJob], float]:
    """`runtime_estimate` for many jobs asked in one pass while the estimator learns nothing
    (within one cycle: a cycle folds no event). Whether the kept estimates still hold is
    checked once, not at each job: backfill asks for every job behind the head (~9,500 in a
    busy cycle). Not to be kept past the pass."""
    if estimates is None or not policy.learned_runtimes:
        return partial(_unlearned, policy)
    return partial(_kept, policy, estimates, _kept_estimates(policy, estimates))


def _kept_estimates(
    policy: SchedulingPolicy, estimates: RuntimeEstimates
) -> dict[object, tuple[object, float]]:
    """The estimates kept for this estimator, what it has learned and this policy.

    What the estimator says changes only when it learns (a job ended): until then each job's
    estimate is kept, by its spec (an update replaces the spec). A cycle asks it for every
    running gang (timers, the head's plan) and every job behind the head (backfill)."""
    global _memo
    memo = _memo
    if (
        memo is None
        or memo[0]() is not estimates
        or memo[1] != estimates.learned
        or memo[2] is not policy
    ):
        memo = _memo = (weakref.ref(estimates), estimates.learned, policy, {})
    return memo[3]


def _unlearned(policy: SchedulingPolicy, job: CoreJob) -> float:
    """The estimate when nothing learned is asked: the job's own words, else the policy's."""
    return min(_runtime_estimate(job, policy, None), MAX_PLANNED_RUNTIME_S)


def _kept(
    policy: SchedulingPolicy,
    estimates: RuntimeEstimates,
    known: dict[object, tuple[object, float]],
    job: CoreJob,
) -> float:
    spec = job.spec
    if spec is not None and spec.estimated_runtime_s is not None:
        # A given estimate is scaled by the team's ratio and capped by the limit: one answer
        # for every job of one (team, estimate, limit), kept once for them all (a burst's
        # first cycle asks for ~9,400 jobs not seen before, of a few dozen such keys).
        given = (spec.team, spec.estimated_runtime_s, spec.max_runtime_s)
        shared = known.get(given)
        if shared is None:
            estimate = min(_runtime_estimate(job, policy, estimates), MAX_PLANNED_RUNTIME_S)
            known[given] = (None, estimate)
            return estimate
        return shared[1]
    seen = known.get(job.job_id)
    if seen is not None and seen[0] is spec:
        return seen[1]
    estimate = min(_runtime_estimate(job, policy, estimates), MAX_PLANNED_RUNTIME_S)
    known[job.job_id] = (spec, estimate)
    return estimate


# (estimator, what it had learned, policy, job id → (spec, estimate) and (team, given
# estimate, limit) → (None, estimate)): the estimates of one estimator while it learns
# nothing new; held weakly, it never keeps an estimator alive.
_Memo = tuple[
    "weakref.ref[RuntimeEstimates]", int, SchedulingPolicy, dict[object, tuple[object, float]]
]
_memo: _Memo | None = None


def _runtime_estimate(
    job: CoreJob, policy: SchedulingPolicy, estimates: RuntimeEstimates | None
) -> float:
    return _spec_estimate(job.job_id, job.spec, policy, estimates)


def spec_runtime_estimate(
    job_id: str, spec: JobSpec | None, policy: SchedulingPolicy, estimates: RuntimeEstimates | None
) -> float:
    """`runtime_estimate` of a job known by its id and spec alone (the auditor's model of a
    job is no CoreJob): the same sources, the same cap."""
    return min(_spec_estimate(job_id, spec, policy, estimates), MAX_PLANNED_RUNTIME_S)


def _spec_estimate(
    job_id: str, spec: JobSpec | None, policy: SchedulingPolicy, estimates: RuntimeEstimates | None
) -> float:
    if spec is None:
        return policy.default_runtime_estimate_s
    if estimates is not None and policy.learned_runtimes:
        learned = estimates.remaining_s(job_id, spec)
        if learned is not None:
            return learned
    if spec.estimated_runtime_s is not None:
        if spec.max_runtime_s is not None:
            return min(spec.estimated_runtime_s, spec.max_runtime_s)
        return spec.estimated_runtime_s
    if spec.max_runtime_s is not None:
        return spec.max_runtime_s
    return policy.default_runtime_estimate_s


def estimated_end(
    job: CoreJob, now: float, policy: SchedulingPolicy, estimates: RuntimeEstimates | None = None
) -> float:
    """When the gang is expected to release its GPUs.

    A gang being preempted leaves by its grace deadline. One past its estimate may end at any
    moment: it is planned to end `overrun_grace_s` after `now`, or, when jobs like it were
    learned, when those that ran as long went on to end. Either way the estimate moved, never
    the job: it runs on (an estimate is never a limit) and the reservation is planned again.
    """
    if job.state == "preempting" and job.preempt_requested_at is not None:
        return max(now, job.preempt_requested_at + job.preempt_grace_s)
    started = job.held_since
    if started is None:
        started = now
    end = started + runtime_estimate(job, policy, estimates)
    if end > now:
        return end
    return _overrun_end(job.job_id, job.spec, now, started, policy, estimates)


def _overrun_end(
    job_id: str,
    spec: JobSpec | None,
    now: float,
    started: float,
    policy: SchedulingPolicy,
    estimates: RuntimeEstimates | None,
) -> float:
    """`estimated_end` of a gang not being preempted that holds its GPUs since `started` and
    is at or past its estimate."""
    later = policy.overrun_grace_s
    if estimates is not None and policy.learned_runtimes and spec is not None:
        beyond = estimates.beyond_s(job_id, spec, now - started)
        if beyond is not None:
            later = max(later, beyond)
    return now + later


def has_overrun(
    job: CoreJob, now: float, policy: SchedulingPolicy, estimates: RuntimeEstimates | None = None
) -> bool:
    """Whether the gang runs past its estimate (a fact for plans and reasons, never grounds
    to stop or evict it)."""
    started = job.held_since
    return started is not None and now > started + runtime_estimate(job, policy, estimates)


def plan_reservation(
    ctx: CycleContext, snap: Snapshot, shape: Shape, *, gather: bool = True
) -> tuple[float, Allocation] | None:
    """(start time, allocation) for the head: replay gang ends on a copy until the head fits.

    The gangs bound earlier in this cycle (`ctx.placed_gangs`: their end, their ranks) are not
    yet in the state, but hold GPUs all the same; those it released hold none.

    `gather`: released GPUs enter the snapshot per node, only before a try (below); without,
    rank by rank as each gang ends: the same plan, slower (the reference it is tested against).
    """
    now, policy = ctx.now, ctx.policy
    # The plan ignores reservations (its placements pass avoid_reserved=False): it is the head's.
    # A wide trial: a wide head's plan releases thousands of running ranks, far more nodes
    # than a busy cluster has free, and the index is put back whole rather than node by node.
    with snap.wide_trial() as planning:
        ends = gang_ends(ctx, shape)
        ends += ctx.placed_gangs
        stopping = _stopping(ctx, shape)
        if stopping:
            # Stopping ranks gave their CPUs and memory back at release (core/host.py).
            ends.append((now + policy.overrun_grace_s, stopping, (0, 0)))
        # By end only: gangs that end at the same moment are released together (below).
        ends.sort(key=itemgetter(0))
        tries = 0
        freed_at_last_try = -1
        freed = 0
        # Progress is counted in what the head needs: GPUs, or a CPU-only head's CPUs.
        cpu_only = shape.cpu_only
        if cpu_only:
            step = max(shape.cpus_milli, shape.cpus_milli * shape.min_units // 8)
        else:
            step = max(shape.unit_gpus, shape.min_gpus // 8)
        # Gangs that end at the same moment are all gone before the head is tried: its
        # placement then picks among all they free (its preferred rack, its best fit), not the
        # first nodes the list happens to count out.
        # The released GPUs are gathered per node (node index -> its free GPUs then) and enter
        # the index only before a try: a wide head's plan releases thousands of ranks, several
        # to a node, between two tries, and a node entering the index costs several updates
        # (its level, rack, block, pool). `total_free` is what the index would count.
        free, usable = planning.free, planning.usable
        gathered: dict[int, int] = {}
        total_free = planning.total_free
        for end, ending in groupby(ends, key=itemgetter(0)):
            for _, ranks, (cpus, memory) in ending:
                for index, mask in ranks:
                    if not gather:
                        planning.release(index, mask)
                        total_free = planning.total_free
                    elif back := usable(index, mask):
                        before = gathered.get(index)
                        if before is None:
                            before = free.get(index, 0)
                        total_free += (back & ~before).bit_count()
                        gathered[index] = before | back
                    freed += cpus if cpu_only else mask.bit_count()
                    if cpus or memory:
                        planning.shift_host(index, -cpus, -memory)
            if total_free < shape.min_gpus:
                continue
            if tries >= EAGER_TRIES and freed - freed_at_last_try < step:
                continue
            tries += 1
            freed_at_last_try = freed
            planning.release_gathered(gathered)
            gathered.clear()
            allocation = find_placement(planning, shape, False)
            if allocation is not None:
                return max(end, now), allocation
        # A last look with every gang ended: the loop may have skipped the tries since its last
        # one (less than a step freed, or only CPUs and memory a GPU head also needs).
        planning.release_gathered(gathered)
        allocation = find_placement(planning, shape, False)
        if allocation is not None:
            last = ends[-1][0] if ends else now
            return max(last, now), allocation
        return None


def gang_ends(
    ctx: CycleContext, shape: Shape, *, each: bool = False
) -> list[tuple[float, list[tuple[int, int]], tuple[int, int]]]:
    """(`estimated_end`, ranks, what a rank asks of its host) of each gang holding GPUs of the
    head's pool, in `holding_jobs` order, but those this cycle released.

    Asked of every running gang (~1,800) in every busy cycle: with the planner's timers
    (`ctx.held_ends`) a gang with an end of its own is read from what they keep, its record
    not visited (in a busy cycle the records are cold: reading ~1,800 of them cost more than
    all else here). Without them (`Planner(timers=False)`, the reference the timers are tested
    against) or with `each`, `estimated_end` is asked of each gang."""
    if ctx.held_ends is not None and not each:
        return _kept_gang_ends(ctx, shape, *ctx.held_ends)
    now, policy, released = ctx.now, ctx.policy, ctx.released
    estimates = ctx.state.estimates
    nodes = ctx.state.node_records
    gpu_type = shape.gpu_type
    return [
        (estimated_end(job, now, policy, estimates), job.ranks, rank_host(job.spec))
        for job in ctx.state.holding_jobs.values()
        if job.ranks
        and job.job_id not in released
        and (gpu_type is None or nodes[job.ranks[0][0]].gpu_type == gpu_type)
    ]


def _kept_gang_ends(
    ctx: CycleContext, shape: Shape, end_of: dict[str, float], held: dict[str, HeldGang]
) -> list[tuple[float, list[tuple[int, int]], tuple[int, int]]]:
    """`gang_ends` from the ends the timers keep (`end_of`: start plus estimate, as
    `estimated_end` reckons it) and what they keep of each gang (`held`); a gang without
    one (being preempted, or without a binding time) is worked out from its record."""
    now, policy, released = ctx.now, ctx.policy, ctx.released
    estimates = ctx.state.estimates
    nodes = ctx.state.node_records
    holding = ctx.state.holding_jobs
    gpu_type = shape.gpu_type
    ends: list[tuple[float, list[tuple[int, int]], tuple[int, int]]] = []
    for job_id in holding:
        end = end_of.get(job_id)
        if end is None:
            job = holding[job_id]
            ranks = job.ranks
            if not ranks or job_id in released:
                continue
            if gpu_type is not None and nodes[ranks[0][0]].gpu_type != gpu_type:
                continue
            ends.append((estimated_end(job, now, policy, estimates), ranks, rank_host(job.spec)))
            continue
        ranks, host, started, spec, _ = held[job_id]
        if not ranks or job_id in released:
            continue
        if gpu_type is not None and nodes[ranks[0][0]].gpu_type != gpu_type:
            continue
        if end <= now:
            end = _overrun_end(job_id, spec, now, started, policy, estimates)
        ends.append((end, ranks, host))
    return ends


def _stopping(ctx: CycleContext, shape: Shape) -> list[tuple[int, int]]:
    """The GPUs of released gangs' ranks that have not exited yet, (node index, mask) in the
    head's pool: earlier releases' (lingering on their node) and this cycle's. A rank may take
    its stop timeout to die; it ends any moment, so the plan frees them `overrun_grace_s` after
    now, as it does an overrunning gang's. Left out, a head that waits only for them got no
    reservation and read "it does not fit even when the running gangs end"."""
    nodes, jobs = ctx.state.node_records, ctx.state.job_records
    stopping = [(index, nodes[index].lingering_mask) for index in sorted(ctx.state.lingering_nodes)]
    for job_id in sorted(ctx.released):
        job = jobs[job_id]
        stopping += [place for rank, place in enumerate(job.ranks) if job.still_runs(rank)]
    if shape.gpu_type is None:
        return stopping
    return [(index, mask) for index, mask in stopping if nodes[index].gpu_type == shape.gpu_type]


def record_reservation(ctx: CycleContext, reservation: HeadReservation) -> None:
    """Record the head's reservation as planned this cycle (ReservationPlanned), once a cycle,
    and word the head's reason from it.

    The place phase records it when it moves past the policy's threshold or to other racks
    (core/backfill.py `reserve`); the preemption phase, when it evicts for a job that the
    backfill rule keeps off the reserved nodes (`kept_off_reserved`): the log then names the
    nodes and start that decision rested on, which the auditor reads in that very cycle."""
    if reservation.recorded:
        return
    reservation.recorded = True
    start = reservation.start
    ctx.emit(
        ReservationPlanned(
            job_id=reservation.head.job_id,
            start_at=datetime.fromtimestamp(start, UTC),
            nodes=reservation.node_ids,
            decided_at=datetime.fromtimestamp(ctx.now, UTC),
        )
    )
    ctx.outcomes[reservation.head.job_id] = head_outcome(reservation, start)


def head_outcome(reservation: HeadReservation, recorded: float) -> Outcome:
    """The head's reason: the start its reservation recorded, not this cycle's plan (a plan
    drifts with the clock, and worded to the minute it gave the head a new reason, an event,
    every minute it waited; the recorded start is within the move threshold of the plan, and
    it is the estimated start the job shows beside its reason)."""
    moment = datetime.fromtimestamp(recorded, UTC).strftime("%Y-%m-%d %H:%M UTC")
    return Outcome(
        RESERVED_HEAD,
        f"{reservation.head.need}; earliest at {moment} on {reservation.where}",
    )
