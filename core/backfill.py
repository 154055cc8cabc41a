"""Phases 4 and 5 of the cycle, place and backfill: each waiting job in order gets quota, then
a topology-fit placement committed whole; the first job that cannot start becomes the head,
with a reservation on concrete nodes, and later jobs may only start where they do not delay it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from core.built_events import gang_reserved, rank_placement
from core.checkpointing import checkpoint_interval_s
from core.context import CycleContext, HeadReservation, Outcome
from core.fractional import place_fractional
from core.host import host_blocker, host_infeasible
from core.host_quota import charge_tasks, within_host_ceilings
from core.placement import Allocation, Shape, Snapshot, find_placement, take_lowest
from core.preemption import ReclaimLandings, VictimBook
from core.quota import QuotaBook
from core.reservation import (
    head_outcome,
    kept_off_reserved,
    plan_reservation,
    record_reservation,
    runtime_estimate,
    runtime_estimator,
)
from core.shape import FailureKey, describe_need, pool_gpu_type, shape_pools
from core.slo import headroom_blocks
from core.state import CoreJob, bits
from core.surface import PlanningSurface
from schemas.reasons import RESERVED_HEAD, DeferCode

_NO_CAPACITY = "waiting for enough free GPUs in one placement"
# A tp gang on a cluster with PCIe boxes (`Shape.nvlink`): their free GPUs are of no use to it.
_NO_NVLINK_CAPACITY = "waiting for enough free GPUs joined by NVLink in one placement"


def _no_capacity(shape: Shape) -> str:
    return _NO_NVLINK_CAPACITY if shape.nvlink else _NO_CAPACITY


_AWAITING_VICTIMS = "waiting for the gangs it preempted to release their GPUs"
# The reasons of jobs waiting behind the head name no job: a new head would otherwise record a
# new reason for every job in the queue (the head's own reason names its planned start).
_BEHIND_FIFO = "waiting behind the first job in line (fifo)"
_BEHIND_NO_BACKFILL = "waiting behind the first job in line (backfill is off)"
_BACKFILL_BLOCKED = (
    "free GPUs are held for the reservation of the first job in line, "
    "and this job would not end before it starts"
)
# Reasons that stay true while no GPU at all is free (a quota or shape reason may not).
_STILL_TRUE_WHEN_FULL: frozenset[DeferCode] = frozenset(
    {"no_capacity", "backfill_blocked", "preempting"}
)

# Jobs in line whose reservation cannot be planned at all, passed over for the head in one
# cycle before the next such job stays the head without one (each costs a plan).
MAX_UNPLANNED_HEADS = 4
# "Not asked yet" in the per-shape answers, where None is an answer.
_UNKNOWN = ""


@dataclass(slots=True)
class Placed:
    """What placing left: the jobs that wait for capacity (preemption may help them)."""

    blocked: list[CoreJob] = field(default_factory=list)
    # Free GPUs held for preemptors awaiting their victims (node index -> mask), out of the
    # snapshot while later jobs are placed (`_hold_for_reclaim`).
    held: dict[int, int] = field(default_factory=dict)

    def give_back_holds(self, snap: Snapshot) -> None:
        """Put the held GPUs back before the preemption phase: they are idle, and no gang is
        evicted while idle GPUs could host its preemptor (DESIGN §3), held or not."""
        for index, mask in self.held.items():
            snap.set_free(index, snap.free.get(index, 0) | mask)
        self.held.clear()


def place(
    ctx: CycleContext,
    snap: Snapshot,
    waiting: list[CoreJob],
    quota: QuotaBook,
    *,
    behind_memo: bool = True,
    victims: VictimBook | None = None,
) -> Placed:
    """Place jobs in order; the head's id goes to `ctx.result.head_job_id`.

    A job within its queue's guarantee that finds no room holds the free GPUs its reclaim
    will land on from the jobs behind it (core/preemption.py `ReclaimLandings`; `victims`,
    the planner's book, gives the gangs it may take).

    `behind_memo`: a job behind the head that fits nowhere takes the outcome of the last job
    of its shape (and `avoid`) while the snapshot has not changed since: a burst of ~9,500
    first reasons is a few dozen shapes. Without it each is worked out on its own: the same
    outcomes, slower (the reference the memo is tested against).
    """
    policy, now, outcomes = ctx.policy, ctx.now, ctx.outcomes
    estimate = runtime_estimator(policy, ctx.state.estimates)
    fifo = policy.is_fifo
    enforce = policy.enforce_quotas and not fifo
    failed: dict[FailureKey, int] = {}
    fits_unreserved: dict[Shape, tuple[int, bool]] = {}
    host_blocks: dict[tuple[Shape, bool], tuple[int, tuple[DeferCode, str] | None]] = {}
    # A queue's ceiling answer for a need, while the quota book takes no charge: (charges,
    # outcome or None, whether the job goes to the preemption phase). Nearly every job a busy
    # cycle places is held back by its queue's ceiling (7.8 million on the Philly window with
    # strict quotas), jobs of a dozen queues and a few needs. The need (worded from the job's
    # shape) is known by its shape's identity: jobs of one shape share it (core/state.py
    # `_one_shape`), and every waiting job, so its shape, lives through the cycle.
    ceilings: dict[tuple[str, int, int], tuple[int, Outcome | None, bool]] = {}
    # Behind the head: (shape, avoid) → (the snapshot's change count, the outcome) of the last
    # job that fit nowhere. What decides that outcome is the shape, `avoid`, the head (set
    # once, before any entry) and the snapshot (the per-shape answers below are kept by its
    # change count as well); the need it words is the shape's.
    behind: dict[tuple[Shape, bool], tuple[int, Outcome]] = {}
    # Shapes whose two entries above hold the same outcome at the same change count: a job of
    # such a shape takes it whatever its `avoid`, so its runtime estimate (what `avoid` is
    # worked out from, ~1.5 µs a job not seen before) is not asked. In a burst's first cycle
    # on a full cluster nearly every shape fails both ways alike ("no_capacity").
    behind_either: dict[Shape, tuple[int, Outcome]] = {}
    placed = Placed()
    blocked = placed.blocked
    reclaims = ReclaimLandings(ctx, quota, victims)
    # (Read for every job that waits: a busy cycle blocks ~9,500; none when no queue has a
    # guarantee.)
    reclaimers = reclaims.queues
    head: CoreJob | None = None
    head_start: float | None = None
    # The reservations recorded for the jobs waiting as heads (read when first asked).
    recorded_heads: list[tuple[str, float, frozenset[int]]] | None = None
    budget = policy.max_placements_per_cycle
    unplanned = 0
    for job in waiting:
        shape = job.shape
        if shape is None:
            continue
        if (
            snap.total_free == 0
            and head is not None
            and not shape.cpu_only
            and not job.awaiting_victims
            and job.reason_code in _STILL_TRUE_WHEN_FULL
        ):
            # Nothing is free: the job's recorded reason still holds; skip the work.
            blocked.append(job)
            continue
        if job.awaiting_victims:
            pending_victims = ctx.victims_pending(job)
            if pending_victims:
                # Where it lands once they are gone: off the head's nodes if the backfill rule
                # keeps it off them (its reclaim was planned so).
                kept_off = (
                    job.queue in reclaimers
                    and head is not None
                    and kept_off_reserved(now, head_start, estimate, job)
                )
                _hold_for_reclaim(ctx, snap, shape, pending_victims, placed.held, avoid=kept_off)
                # No count of the victims still checkpointing: it gave the preemptor a new
                # reason, an event, for every victim gone (their evictions are in the log).
                outcomes[job.job_id] = Outcome(
                    "awaiting_preemption", f"{job.need}; {_AWAITING_VICTIMS}"
                )
                continue
        if fifo and head is not None:
            outcomes[job.job_id] = Outcome("head_of_line", _BEHIND_FIFO)
            continue
        fractional = job.fractional
        if enforce and shape.asks_host:
            # CPU and memory ceilings of the queue tree (core/host_quota.py).
            capped = within_host_ceilings(quota, job, shape, whole=fractional)
            if isinstance(capped, Outcome):
                outcomes[job.job_id] = capped
                continue
            shape = capped
        if fractional:
            # Slices and shares go through the sharing ledger (core/fractional.py).
            if place_fractional(
                ctx,
                snap,
                job,
                quota,
                enforce_quota=enforce,
                behind_head=head is not None and not policy.backfill,
                budget_left=budget > 0,
            ):
                budget -= 1
                charge_tasks(quota, job, shape, shape.units * shape.tasks_per_unit)
            continue
        if enforce:
            ceiling_key = (job.queue, shape.min_gpus, id(job.shape))
            known = ceilings.get(ceiling_key)
            if known is None or known[0] != quota.charges:
                known = ceilings[ceiling_key] = _ceiling(quota, job, shape.min_gpus)
            if known[1] is not None:
                if known[2]:
                    blocked.append(job)
                outcomes[job.job_id] = known[1]
                continue
        if head is not None and not policy.backfill:
            outcomes[job.job_id] = Outcome("behind_head", f"{job.need}; {_BEHIND_NO_BACKFILL}")
            continue
        avoid: bool | None = None
        if head is not None and behind_memo and budget > 0 and shape is job.shape:
            # (A shape with an entry here fits the cluster: it was asked `_infeasible` first.)
            either = behind_either.get(shape)
            if either is not None and either[0] == snap.changes:
                blocked.append(job)
                outcomes[job.job_id] = either[1]
                if job.queue in reclaimers:
                    kept_off = kept_off_reserved(now, head_start, estimate, job)
                    _hold_reclaim(ctx, snap, job, quota, reclaims, placed.held, kept_off)
                continue
            avoid = kept_off_reserved(now, head_start, estimate, job)
            # (A shape capped by the host ceilings is not the job's own: its need differs.)
            seen = behind.get((shape, avoid))
            if seen is not None and seen[0] == snap.changes:
                blocked.append(job)
                outcomes[job.job_id] = seen[1]
                if job.queue in reclaimers:
                    _hold_reclaim(ctx, snap, job, quota, reclaims, placed.held, avoid)
                continue
        infeasible = _infeasible(ctx, shape)
        if infeasible is not None:
            outcomes[job.job_id] = Outcome("unsatisfiable", infeasible)
            continue
        if budget <= 0:
            outcomes[job.job_id] = Outcome(
                "cycle_budget", f"{job.need}; placement deferred to the next cycle"
            )
            continue
        if avoid is None:
            # The backfill rule: a job behind the head keeps off its reserved nodes unless it
            # ends before the head's planned start.
            avoid = head is not None and kept_off_reserved(now, head_start, estimate, job)
        allocation = None
        if head is None and job.awaiting_victims and job.queue in reclaimers:
            # A preemptor whose victims are gone goes first, before this cycle's head is
            # known: where its reclaim was planned off a recorded reservation it is kept
            # off, it lands off it (on what it paid for), not on the head's idle GPUs.
            if recorded_heads is None:
                recorded_heads = _recorded_heads(ctx, waiting)
            allocation = _place_off_recorded(ctx, snap, job, shape, recorded_heads, estimate)
        if allocation is None:
            allocation = _try_place(snap, shape, avoid, failed)
        if allocation is not None and headroom_blocks(ctx, snap, job, shape, allocation, quota):
            continue
        if allocation is not None:
            _bind(ctx, snap, job, shape, allocation, quota)
            budget -= 1
            continue
        blocked.append(job)
        if head is None and _may_be_head(ctx, job):
            head = job
            ctx.result.head_job_id = job.job_id
            if fifo or not policy.backfill:
                outcomes[job.job_id] = Outcome("no_capacity", f"{job.need}; {_no_capacity(shape)}")
                continue
            ahead = frozenset(other.job_id for other in blocked[:-1])
            head_start = reserve(ctx, snap, job, shape, ahead)
            if head_start is None and unplanned < MAX_UNPLANNED_HEADS:
                # It fits nowhere even once the running gangs end (ranks of released gangs
                # still run): holding no reservation, it must not keep the next job in line
                # from holding one, or backfill would run past that gang unchecked.
                unplanned += 1
                head = None
                ctx.result.head_job_id = None
            else:
                failed = {key: k for key, k in failed.items() if not key[3]}
            # (After its reservation: planned on the GPUs free now, the held ones among them.)
            if job.queue in reclaimers:
                _hold_reclaim(ctx, snap, job, quota, reclaims, placed.held, False)
            continue
        if avoid and head is not None and _fits_unreserved(snap, shape, failed, fits_unreserved):
            outcome = Outcome("backfill_blocked", f"{job.need}; {_BACKFILL_BLOCKED}")
        elif (blocker := _host_blocker(snap, shape, avoid, host_blocks)) is not None:
            outcome = Outcome(blocker[0], f"{job.need}; {blocker[1]}")
        else:
            outcome = Outcome("no_capacity", f"{job.need}; {_no_capacity(shape)}")
        outcomes[job.job_id] = outcome
        if head is not None and shape is job.shape:
            behind[(shape, avoid)] = (snap.changes, outcome)
            other = behind.get((shape, not avoid))
            if other is not None and other[0] == snap.changes and other[1] == outcome:
                behind_either[shape] = (snap.changes, outcome)
        if job.queue in reclaimers:
            _hold_reclaim(ctx, snap, job, quota, reclaims, placed.held, avoid)
    return placed


def _hold_reclaim(
    ctx: CycleContext,
    snap: Snapshot,
    job: CoreJob,
    quota: QuotaBook,
    reclaims: ReclaimLandings,
    held: dict[int, int],
    kept_off: bool,
) -> None:
    """Hold the free GPUs the waiting job's reclaim lands on, if it reclaims this cycle
    (`kept_off`: the backfill rule keeps it off the head's reserved nodes)."""
    victims = reclaims.plan(ctx, snap, job, quota, held, kept_off)
    if victims and job.shape is not None:
        _hold_for_reclaim(ctx, snap, job.shape, victims, held, avoid=kept_off)


def _recorded_heads(
    ctx: CycleContext, waiting: list[CoreJob]
) -> list[tuple[str, float, frozenset[int]]]:
    """(job id, start, node indices) of the reservations recorded for waiting jobs that are
    heads now (their reason says so): the one a preemptor's evictions were planned off."""
    state = ctx.state
    heads: list[tuple[str, float, frozenset[int]]] = []
    for job in waiting:
        if job.reason_code != RESERVED_HEAD or not job.reserved_nodes:
            continue
        if job.estimated_start is None:
            continue
        records = (state.node_record(node_id) for node_id in job.reserved_nodes)
        nodes = frozenset(record.index for record in records if record is not None)
        heads.append((job.job_id, job.estimated_start, nodes))
    return heads


def _place_off_recorded(
    ctx: CycleContext,
    snap: Snapshot,
    job: CoreJob,
    shape: Shape,
    heads: list[tuple[str, float, frozenset[int]]],
    estimate: Callable[[CoreJob], float],
) -> Allocation | None:
    """A placement off the recorded reserved nodes the backfill rule keeps the job off
    (core/reservation.py `kept_off_reserved`), or None: none such, or no room off them."""
    off: set[int] = set()
    for head_id, start, nodes in heads:
        if head_id != job.job_id and kept_off_reserved(ctx.now, start, estimate, job):
            off |= nodes
    if not off or snap.total_free < shape.min_gpus:
        return None
    with snap.trial():
        snap.reserved = frozenset(off)
        return find_placement(snap, shape, True)


def _ceiling(quota: QuotaBook, job: CoreJob, gpus: int) -> tuple[int, Outcome | None, bool]:
    """Whether a ceiling of the job's queue chain holds its `gpus` back: (the book's charges,
    the outcome or None, whether the preemption phase may reclaim for it)."""
    hit = quota.ceiling_hit(job.queue, gpus)
    if hit is None:
        return quota.charges, None, False
    name, ceiling = hit
    message = f"{job.need}; queue {name} would exceed its ceiling of {ceiling} GPUs"
    reclaims = quota.within_guarantee(job.queue, gpus)
    if reclaims:
        # A parent's ceiling filled by a sibling's borrowing is no bar to a queue within its
        # guarantee: the preemption phase reclaims what is borrowed under that ceiling
        # (invariant 4).
        message += f"; queue {job.queue} is within its guarantee and reclaims it"
    # One outcome for all such jobs of the cycle: outcomes are only read.
    return quota.charges, Outcome("quota_ceiling", message), reclaims


def _hold_for_reclaim(
    ctx: CycleContext,
    snap: Snapshot,
    shape: Shape,
    victims: list[str],
    held: dict[int, int],
    *,
    avoid: bool = False,
    gather: bool = True,
) -> None:
    """Hold the free GPUs a preemptor will land on once its victims are gone (off the head's
    reserved nodes with `avoid` where it can, as it will be placed).

    Its preemption plan counted on GPUs free now together with the victims' GPUs; while the
    victims checkpoint, the preemptor is no head and holds no reservation, so without this a
    later job in line (a borrower, even the requeued victim) took those free GPUs and the
    preemptor fit nowhere once its victims left: it reclaimed again after its hysteresis, and
    a queue within its guarantee waited past the bound of invariant 4. The placement is
    planned again each cycle (the victims' GPUs as if released), so the hold follows what is
    free now and ends when the victims are gone and the preemptor is placed. The held GPUs
    are given back to the snapshot before the preemption phase (`Placed.give_back_holds`).
    """
    jobs = ctx.state.job_records
    if gather:
        # The victims' GPUs gathered per node and let in at once (`release_gathered`), as the
        # head's plan does, and the landing read, not committed (`_landing`): a busy cycle
        # plans again for a dozen wide preemptors whose victims hold thousands of ranks.
        # Without, released rank by rank and committed: the reference.
        usable = snap.usable
        gathered: dict[int, int] = {}
        for victim in victims:
            for index, mask in jobs[victim].ranks:
                back = usable(index, mask)
                if back:
                    gathered[index] = gathered.get(index, 0) | back
        with snap.trial_releasing(len(gathered)):
            snap.release_gathered(gathered)
            landing = _landing(snap, shape, avoid)
    else:
        with snap.trial_releasing(sum(len(jobs[victim].ranks) for victim in victims)):
            for victim in victims:
                for index, mask in jobs[victim].ranks:
                    snap.release(index, mask)
            allocation = find_placement(snap, shape, avoid)
            if allocation is None and avoid:
                allocation = find_placement(snap, shape, False)
            landing = None if allocation is None else snap.commit(shape, allocation)
    if landing is None:
        return
    # Only the GPUs free now are held; the victims' own are still theirs until they leave.
    for index, mask in landing:
        free_now = snap.free.get(index, 0) & mask
        if free_now:
            snap.set_free(index, snap.free[index] & ~free_now)
            held[index] = held.get(index, 0) | free_now


def _landing(snap: Snapshot, shape: Shape, avoid: bool = False) -> list[tuple[int, int]] | None:
    """The GPUs the gang would take on each node where it lands on the snapshot as it is:
    those `Snapshot.commit` gives its ranks there, the node's lowest free GPUs, one by one.
    Read without committing: only the hold is wanted of them, and a wide preemptor's commit
    (hundreds of ranks, each a change of the index, undone with the trial) was most of the
    cost of planning its landing again in every cycle while its victims checkpoint."""
    allocation = find_placement(snap, shape, avoid)
    if allocation is None and avoid:
        # Its victims' GPUs on the reserved nodes are its own room: it goes first once
        # they are gone (`_place_off_recorded` falls back so too).
        allocation = find_placement(snap, shape, False)
    if allocation is None:
        return None
    free, nodes = snap.free, snap.nodes
    left: dict[int, int] = {}
    per_unit = shape.tasks_per_unit * shape.gpus_per_task
    taken: list[tuple[int, int]] = []
    # In the order `commit` binds them (the holds then enter the snapshot in the same order).
    for index, units in sorted(
        allocation, key=lambda item: (nodes[item[0]].block_id, nodes[item[0]].rack_id, item[0])
    ):
        mask = left.get(index)
        if mask is None:
            mask = free.get(index, 0)
        wanted = units * per_unit
        if wanted >= mask.bit_count():
            take, mask = mask, 0  # the whole of what is free there (most nodes of a wide gang)
        else:
            take = take_lowest(mask, wanted)
            mask ^= take
        left[index] = mask
        taken.append((index, take))
    return taken


def _may_be_head(ctx: CycleContext, job: CoreJob) -> bool:
    """Best-effort work runs on idle capacity only; it never holds a reservation."""
    return ctx.policy.is_fifo or job.priority != ctx.policy.idle_only_priority


def _try_place(
    snap: Snapshot, shape: Shape, avoid: bool, failed: dict[FailureKey, int]
) -> Allocation | None:
    # Capacity only shrinks while placing, so a shape that failed makes larger ones fail too.
    key = shape.failure_key(avoid)
    smallest_failure = failed.get(key)
    if smallest_failure is not None and shape.min_units >= smallest_failure:
        return None
    if snap.total_free < shape.min_gpus:
        return None
    allocation = find_placement(snap, shape, avoid)
    if allocation is None:
        failed[key] = min(shape.min_units, smallest_failure or shape.min_units)
    return allocation


def _fits_unreserved(
    snap: Snapshot,
    shape: Shape,
    failed: dict[FailureKey, int],
    known: dict[Shape, tuple[int, bool]],
) -> bool:
    """Whether the gang would fit but for the head's reservation.

    Thousands of waiting jobs of a few shapes ask this in one cycle; the answer for a shape
    holds until the snapshot changes.
    """
    seen = known.get(shape)
    if seen is not None and seen[0] == snap.changes:
        return seen[1]
    fits = _try_place(snap, shape, False, failed) is not None
    known[shape] = (snap.changes, fits)
    return fits


def _host_blocker(
    snap: Snapshot,
    shape: Shape,
    avoid: bool,
    known: dict[tuple[Shape, bool], tuple[int, tuple[DeferCode, str] | None]],
) -> tuple[DeferCode, str] | None:
    """The CPUs or memory that keep the gang out (core/host.py); the answer for a shape
    holds until the snapshot changes."""
    if not (shape.asks_host or shape.cpu_only):
        return None
    seen = known.get((shape, avoid))
    if seen is not None and seen[0] == snap.changes:
        return seen[1]
    blocker = host_blocker(snap, shape, avoid)
    known[(shape, avoid)] = (snap.changes, blocker)
    return blocker


def _infeasible(ctx: CycleContext, shape: Shape) -> str | None:
    """Why the gang could never fit this cluster as it is (empty), or None; once per shape."""
    # One lookup, not two: thousands of jobs ask in one cycle, and hashing a Shape walks its
    # fields.
    why = ctx.infeasibility.get(shape, _UNKNOWN)
    if why is not _UNKNOWN:
        return why
    why = _why_infeasible(ctx.state, shape)
    if why is None:
        host = host_infeasible(ctx.state, shape)
        why = None if host is None else f"{describe_need(shape)}; {host}"
    ctx.infeasibility[shape] = why
    return why


def _why_infeasible(state: PlanningSurface, shape: Shape) -> str | None:
    biggest, pools = state.capacity_profile()
    # Pools are GPU types, with nodes whose GPUs NVLink does not join set apart (core/shape.py).
    of_kind = [pool for pool in pools if shape.gpu_type in (None, pool_gpu_type(pool))]
    if shape.gpu_type is not None and not of_kind:
        return f"{describe_need(shape)}; the cluster has no schedulable {shape.gpu_type} GPUs"
    usable = [pool for pool in shape_pools(shape, pools) if pool in pools]
    if of_kind and not usable:
        of_type = "" if shape.gpu_type is None else f"{shape.gpu_type} "
        return (
            f"{describe_need(shape)}; no schedulable node joins its {of_type}GPUs by NVLink, "
            "and a tensor-parallel group never spans GPUs that talk over PCIe"
        )
    largest = max((biggest.get(pool, 0) for pool in usable), default=0)
    if shape.unit_gpus > largest:
        # Named so only where some node of the kind lacks NVLink, not on a cluster of NVLink.
        joined = " joined by NVLink" if len(usable) < len(of_kind) else ""
        return (
            f"{describe_need(shape)}; no schedulable node has {shape.unit_gpus} healthy "
            f"GPUs{joined} (largest has {largest})"
        )
    if shape.require == "node" and shape.min_gpus > largest:
        return f"{describe_need(shape)}; no schedulable node has that many (largest has {largest})"
    capacity = max((pools.get(pool, 0) for pool in usable), default=0)
    if shape.min_gpus > capacity:
        # A gang takes GPUs of one pool: a type's nodes with and without NVLink never mix.
        split = len(of_kind) > len({pool_gpu_type(pool) for pool in of_kind})
        note = " for one gang (a gang never mixes nodes with and without NVLink)"
        if shape.nvlink:
            note = " joined by NVLink"
        return (
            f"{describe_need(shape)}; the cluster has only {capacity} schedulable GPUs of that "
            f"kind{note if split else ''}"
        )
    return None


def _bind(
    ctx: CycleContext,
    snap: Snapshot,
    job: CoreJob,
    shape: Shape,
    allocation: Allocation,
    quota: QuotaBook,
) -> None:
    ranks = snap.commit(shape, allocation)
    estimate = runtime_estimate(job, ctx.policy, ctx.state.estimates)
    ctx.placed_gangs.append((ctx.now + estimate, ranks, (shape.cpus_milli, shape.memory_mb)))
    nodes = ctx.state.node_records
    interval = None
    if job.spec is not None and job.spec.checkpoint.interval_s is not None:
        interval = checkpoint_interval_s(
            ctx.state.checkpoints,
            job.job_id,
            job.spec,
            nodes[ranks[0][0]].gpu_type,
            len({index for index, _ in ranks}),
            ctx.now,
        )
    ctx.emit(
        # Built without re-validation (core/built_events.py): the core constructs these from
        # checked state, and a cycle binding thousands of ranks would otherwise spend its time
        # in validators and pydantic's constructor.
        gang_reserved(
            job.job_id,
            job.attempt + 1,
            [
                rank_placement(rank, nodes[index].node_id, bits(mask))
                for rank, (index, mask) in enumerate(ranks)
            ],
            interval,
        )
    )
    quota.charge(job.queue, sum(mask.bit_count() for _, mask in ranks))
    charge_tasks(quota, job, shape, len(ranks))
    ctx.result.gangs_placed += 1
    ctx.result.tasks_placed += len(ranks)


def reserve(
    ctx: CycleContext,
    snap: Snapshot,
    job: CoreJob,
    shape: Shape,
    ahead: frozenset[str] = frozenset(),
) -> float | None:
    """Plan the head's earliest start on concrete nodes; pin them against backfill.

    `ahead`: the jobs blocked before it (`HeadReservation.ahead`)."""
    state, policy = ctx.state, ctx.policy
    planned = plan_reservation(ctx, snap, shape)
    if planned is None:
        ctx.outcomes[job.job_id] = Outcome(
            "no_capacity",
            f"{job.need}; it does not fit even when the running gangs end",
        )
        return None
    start, allocation = planned
    snap.reserved = frozenset(index for index, _ in allocation)
    nodes = state.node_records
    node_ids = sorted(nodes[index].node_id for index, _ in allocation)
    where = _racks_of(state, node_ids)
    reservation = ctx.reservation = HeadReservation(job, start, node_ids, where, ahead)
    recorded = job.estimated_start
    if (
        recorded is None
        or abs(recorded - start) > policy.reservation_move_threshold_s
        or _racks_of(state, list(job.reserved_nodes)) != where
    ):
        record_reservation(ctx, reservation)
    else:
        ctx.outcomes[job.job_id] = head_outcome(reservation, recorded)
    ctx.wakeups.append(start)
    return start


def _racks_of(state: PlanningSurface, node_ids: list[str], limit: int = 4) -> str:
    racks: list[str] = []
    for node_id in node_ids:
        node = state.node_record(node_id)
        if node is not None and node.rack not in racks:
            racks.append(node.rack)
    shown = ", ".join(racks[:limit])
    more = f" and {len(racks) - limit} more" if len(racks) > limit else ""
    label = "rack" if len(racks) == 1 else "racks"
    return f"{label} {shown}{more}"
