"""Whole GPUs back from slices and shares: a whole-GPU gang of a class that may preempt (or a
queue reclaiming its guarantee), which found no room and for which the whole-GPU planner
(core/preemption.py) found no gangs to evict, has the slices and shares that hold the GPUs it
needs checkpointed and evicted (phase 6 of the cycle, after the whole-GPU planner, before
preemption for slices and shares: core/share_preemption.py is the reverse direction).

Which GPUs a gang may get back this way:
- a soft-shared GPU (mps, timeslice) is whole again as soon as its last share leaves;
- a GPU in MIG mode is whole only once its instances are destroyed (NVML: a GPU instance is
  destroyed only with no process on it; the GPU then leaves MIG mode): so only on a
  `mig: dynamic` node, and only where the re-partition planner (core/regeometry.py) would cut
  it back once idle, i.e. past its hysteresis hold; a fixed geometry never goes whole. When its
  last evicted slice is gone the GPU is re-cut to whole at once for the waiting gang
  (`claim_recuts`, called as the cycle's sharing trial opens, before anything is placed, so a
  requeued slice never lands back on it), a GpuGeometryChanged with its `reconfigure_s`, and
  the gang starts when the re-cut is over (`awaiting_repartition`, with that moment);
- an idle GPU in MIG mode (no slice left) is cut back with no eviction at all.
A GPU counts only if every slice or share on it is a victim the gang may take: evicting some
of them would give it nothing; one with a slice or share already leaving is another plan's.

The victims follow the rules of whole-GPU preemption: only a lower class (or, for a queue
within its guarantee, what other queues borrow), never a protected gang (non-preemptible,
younger than its minimum runtime, preempted within the hysteresis), and across queues only
what a queue borrows, whatever its class (invariant 4: the auditor's cross_queue rule, as for
whole gangs; best-effort work within its queue's guarantee is no exception). Borrowers first:
GPUs whose victims all belong to borrowing queues are tried alone before any other; within
that, victims with the least work to lose go first (GPUs x time since their last checkpoint,
core/slo.py; a GPU to re-cut adds its `reconfigure_s` of idle GPU time).

The reverse of the blast radius (a slice never stops a large gang) bounds how much small work
one gang may stop:
- only the GPUs it lands on are emptied (the plan is cut to them), so a gang of n GPUs stops
  the slices and shares of at most n GPUs, and at most MAX_VICTIMS jobs;
- a victim counts at most `inference_max_victim_gpus` GPUs in all (a slice gang spread over
  many GPUs is not stopped to free one of them), and the victims together hold at most twice
  the GPUs emptied (no more small work stopped elsewhere than is freed here);
- at most MAX_RECLAIMING_GANGS gangs plan this in one cycle, each tried once per cycle.
They checkpoint within the policy's grace (the same PreemptionRequested, code `priority` or
`reclaim`) and the gang's `why` says it is waiting on their eviction.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from fractions import Fraction

from core.context import CycleContext, Outcome
from core.host import release_gang
from core.live_sharing import GpuAmount
from core.placement import Shape, Snapshot, find_placement
from core.preemption import Eviction, KeptOff, credit_leaving, is_protected, request_evictions
from core.quota import QuotaBook
from core.regeometry import hold_s_of
from core.reservation import record_reservation
from core.shape import pool_suits
from core.sharing import GpuLedger, NodeLedger
from core.slo import lost_work
from core.state import CoreJob
from schemas.jobs import WAITING_STATES, GangReserved, PreemptionRequested
from schemas.nodes import GpuGeometryChanged, MigInstanceSpec

# Whole-GPU gangs that may evict slices and shares in one cycle.
MAX_RECLAIMING_GANGS = 4
# Slice and share jobs one gang may evict at once (seven 1g slices on each of 64 GPUs).
MAX_VICTIMS = 448
# Blocked gangs looked at per call (each costs a placement search or more).
MAX_GANGS_TRIED = 16
# Placements tried per gang while adding GPUs (each is a placement search).
MAX_TRIES = 48


@dataclass(frozen=True, slots=True)
class SharedGpu:
    """A GPU the gang could get back: what evicting its holders costs and gives."""

    index: int  # the node's index in the snapshot
    node_id: str
    gpu: int
    victims: tuple[CoreJob, ...]
    recut: bool  # in MIG mode: re-cut to whole once empty
    cost: float  # work lost (GPU-seconds), and a re-cut's idle time
    idle: bool = False  # nothing on it (a rank still running there is no victim, but holds it)


def reclaim_shared_gpus(
    ctx: CycleContext,
    snap: Snapshot,
    blocked: list[CoreJob],
    quota: QuotaBook,
    *,
    borrowers_only: bool = False,
) -> set[str]:
    """Checkpoint-then-evict slices and shares for the whole-GPU gangs that found no room;
    returns the gangs it planned for (evictions or re-cuts).

    The cycle calls it twice: before the whole-GPU planner with `borrowers_only` (what other
    queues borrow is reclaimed first, DESIGN §3, whether gangs or slices and shares hold it),
    and after it with every victim the rules allow."""
    trial = ctx.sharing
    served: set[str] = set()
    if trial is None or not trial.sharing_nodes():
        return served
    policy = ctx.policy
    excluded = set(ctx.released) | set(ctx.handled)
    preempting: set[str] = set()
    for event in ctx.result.decisions:
        if isinstance(event, PreemptionRequested):
            excluded.add(event.job_id)
            if event.preemptor_job_id is not None:
                preempting.add(event.preemptor_job_id)
    coming = _coming_whole(ctx)
    planned = tried = 0
    kept_off = KeptOff(ctx)
    for job in blocked:
        if planned >= MAX_RECLAIMING_GANGS or tried >= MAX_GANGS_TRIED:
            break
        shape, spec = job.shape, job.spec
        if shape is None or spec is None or spec.fractional or shape.cpu_only:
            continue
        if job.job_id in preempting or (job.awaiting_victims and ctx.victims_pending(job)):
            continue  # the whole-GPU planner evicts for it, or its victims are still leaving
        if coming and job.awaiting_victims and _waits_for_recut(ctx, snap, job, shape, coming):
            continue
        if ctx.calming(job):
            continue
        pclass = policy.priority_class(job.priority)
        reclaiming = quota.within_guarantee(job.queue, shape.min_gpus)
        if not (pclass.can_preempt or reclaiming) or job.priority == policy.idle_only_priority:
            continue
        if quota.excess(job.queue, shape.min_gpus):
            continue  # a ceiling keeps it out: freeing GPUs would not let it in
        tried += 1
        # A reclaim kept off the head's reserved nodes (core/preemption.py `KeptOff`): their
        # idle GPUs do not serve it, and it takes shared GPUs elsewhere only (invariant 4).
        off = reclaiming and kept_off(job)
        if find_placement(snap, shape, off) is not None:
            continue  # idle capacity serves (a reservation held it back): never evict
        credit_leaving(ctx, quota)
        gpus = _shared_gpus(ctx, job, shape, pclass.rank, reclaiming, quota, excluded, coming)
        if not gpus:
            continue
        planned += 1
        plan = _borrowers_first(ctx, job, quota, snap, shape, gpus, coming, borrowers_only, off)
        if plan is None:
            continue
        victims = list({v.job_id: v for gpu in plan for v in gpu.victims}.values())
        if not _within_bounds(victims, plan):
            continue
        if _placed_borrowers(ctx, job, quota) and not all(
            v.queue != job.queue and quota.borrowing(v.queue) > 0 for v in victims
        ):
            # Gangs this cycle bound for borrowing queues are victims the whole-GPU planner
            # could not see yet: borrowers first, so it gets the next cycle to take them.
            continue
        served.add(job.job_id)
        recut = [gpu for gpu in plan if gpu.recut]
        if victims:
            reservation = ctx.reservation
            if reservation is not None and job.job_id == reservation.head.job_id:
                # The head lands on the GPUs it frees: its reservation keeps no one off.
                reservation.evicting = True
            if off and ctx.reservation is not None:
                # The reservation it rested on, in this cycle, before the evictions (as the
                # whole-GPU planner records it: the auditor judges them by it).
                record_reservation(ctx, ctx.reservation)
            _evict(ctx, job, victims, plan, recut, reclaiming, quota)
            excluded.update(v.job_id for v in victims)
            ctx.handled.update(v.job_id for v in victims)
        for gpu in recut:
            if gpu.idle:
                # An idle GPU in MIG mode: cut back to whole now, for this gang.
                ready = _emit_recut(ctx, gpu.node_id, gpu.gpu, job)
                if ready is not None:
                    coming[(gpu.index, gpu.gpu)] = ready
        if not victims:
            _waits_for_recut(ctx, snap, job, shape, coming)
    return served


def _evict(
    ctx: CycleContext,
    job: CoreJob,
    victims: list[CoreJob],
    plan: list[SharedGpu],
    recut: list[SharedGpu],
    reclaiming: bool,
    quota: QuotaBook,
) -> None:
    emptied = [gpu for gpu in plan if gpu.victims]
    then = ""
    to_cut = [gpu for gpu in recut if gpu.victims]
    if to_cut:
        seconds = max(_reconfigure_s(ctx, gpu.node_id) for gpu in to_cut)
        then = f", then {len(to_cut)} of them leave MIG mode (a re-partition of {seconds:g} s)"
    why = "reclaiming guaranteed capacity" if reclaiming else f"priority {job.priority}"
    count = len(emptied)
    request_evictions(
        ctx,
        job,
        victims,
        Eviction(
            reason=f"preempted for job {job.job_id} ({why}): it needs the whole GPU this "
            "slice or share is on",
            code="reclaim" if reclaiming else "priority",
            waiting=job.need,
            because=f", the slices and shares on {count} GPU{'s' if count != 1 else ''} "
            f"it needs{then}",
        ),
        quota,
        ctx.policy,
    )


def _placed_borrowers(ctx: CycleContext, job: CoreJob, quota: QuotaBook) -> bool:
    """Whether this cycle bound a whole-GPU gang of another queue that borrows."""
    jobs = ctx.state.job_records
    for event in ctx.result.decisions:
        if not isinstance(event, GangReserved):
            continue
        placed = jobs.get(event.job_id)
        if placed is None or placed.queue == job.queue or placed.spec is None:
            continue
        if not placed.spec.fractional and quota.borrowing(placed.queue) > 0:
            return True
    return False


def _reconfigure_s(ctx: CycleContext, node_id: str) -> float:
    trial = ctx.sharing
    assert trial is not None
    return trial.live.ledger.nodes[node_id].reconfigure_s


def _within_bounds(victims: list[CoreJob], plan: list[SharedGpu]) -> bool:
    """The reverse blast radius: few enough victims, not much more work than is freed."""
    if len(victims) > MAX_VICTIMS:
        return False
    emptied = sum(1 for gpu in plan if gpu.victims)
    held: GpuAmount = sum((v.bound_gpus for v in victims), Fraction(0))
    return held <= 2 * emptied


def _shared_gpus(
    ctx: CycleContext,
    job: CoreJob,
    shape: Shape,
    rank: int,
    reclaiming: bool,
    quota: QuotaBook,
    excluded: set[str],
    coming: dict[tuple[int, int], float],
) -> list[SharedGpu]:
    """The GPUs of the gang's pools (its GPU type's; joined by NVLink for a tp gang) that
    evicting their slices and shares (all of them victims it may take) would give back whole."""
    trial = ctx.sharing
    assert trial is not None
    live = trial.live
    ledger = live.ledger
    state = ctx.state
    now = ctx.now
    holding = state.holding_jobs
    verdicts: dict[str, bool] = {}

    def may_take(victim: CoreJob) -> bool:
        known = verdicts.get(victim.job_id)
        if known is None:
            known = verdicts[victim.job_id] = _may_take(
                ctx, job, victim, rank, reclaiming, quota, excluded
            )
        return known

    found: list[SharedGpu] = []
    for node_id in sorted(trial.sharing_nodes()):
        node = ledger.nodes[node_id]
        record = state.node_record(node_id)
        if record is None or not node.schedulable:
            continue
        if not pool_suits(shape, record.pool):
            continue  # another GPU type's, or no NVLink for a tp gang: of no use to it
        for gpu in node.gpus:
            if not gpu.healthy or gpu.whole is not None or now < gpu.busy_until:
                continue
            if (record.index, gpu.index) in coming:
                continue  # already going back to whole
            recut = bool(gpu.geometry)
            if recut and not _may_recut(node, gpu, now):
                continue
            if not recut and not gpu.shares:
                continue  # an idle whole GPU: the snapshot has it
            holders = [holder for holder, _ in gpu.slices.values()] + list(gpu.shares)
            victims: dict[str, CoreJob] = {}
            for holder in holders:
                job_id = holder.rsplit(":", 2)[0]
                victim = holding.get(job_id)
                released = job_id in ctx.released
                if released or victim is None or holder not in live.by_job.get(job_id, {}).values():
                    # A rank of a released gang still runs there: its hold ends when it
                    # exits (its agents were told to stop it), with no eviction.
                    continue
                if not may_take(victim):
                    break
                victims[job_id] = victim
            else:
                cost = sum(lost_work(v, now) for v in victims.values())
                if recut:
                    cost += node.reconfigure_s
                found.append(
                    SharedGpu(
                        record.index,
                        node_id,
                        gpu.index,
                        tuple(victims.values()),
                        recut,
                        cost,
                        idle=not holders,
                    )
                )
    return found


def _may_take(
    ctx: CycleContext,
    job: CoreJob,
    victim: CoreJob,
    rank: int,
    reclaiming: bool,
    quota: QuotaBook,
    excluded: set[str],
) -> bool:
    """Whether the gang may evict this slice or share job (core/preemption.py's rules)."""
    policy = ctx.policy
    if victim.job_id in excluded or victim.job_id == job.job_id:
        return False  # leaving already: its GPU is another plan's, or it goes elsewhere
    if victim.bound_gpus > policy.inference_max_victim_gpus:
        return False  # spread over more GPUs than it gives back
    vrank = policy.priority_class(victim.priority).rank
    same_queue = victim.queue == job.queue
    # Across queues only what a queue borrows, best-effort work too: a gang within its own
    # queue's guarantee is safe from other teams whatever its class (invariant 4; the
    # auditor's cross_queue rule, and core/preemption.py's `reachable`).
    borrower = not same_queue and quota.borrowing(victim.queue) > 0
    lower = rank > vrank and (same_queue or borrower)
    if not (lower or (reclaiming and borrower)):
        return False
    return not is_protected(victim, ctx.now, policy, ctx.wakeups)


def _may_recut(node: NodeLedger, gpu: GpuLedger, now: float) -> bool:
    """A GPU in MIG mode the re-partition planner would cut back to whole once idle."""
    if node.mig != "dynamic" or node.model is None:
        return False
    changed = gpu.geometry_changed_at
    return changed is None or now - changed >= hold_s_of(node, None)


def _borrowers_first(
    ctx: CycleContext,
    job: CoreJob,
    quota: QuotaBook,
    snap: Snapshot,
    shape: Shape,
    gpus: list[SharedGpu],
    coming: dict[tuple[int, int], float],
    borrowers_only: bool,
    off: bool = False,
) -> list[SharedGpu] | None:
    """The plan on the GPUs only borrowers hold (other queues' borrowed capacity is reclaimed
    first, DESIGN §3), else (but `borrowers_only`) on all of them (`off`: `_plan`)."""
    borrowing: dict[str, bool] = {}

    def borrowed(victim: CoreJob) -> bool:
        known = borrowing.get(victim.queue)
        if known is None:
            known = borrowing[victim.queue] = (
                victim.queue != job.queue and quota.borrowing(victim.queue) > 0
            )
        return known

    tier = [gpu for gpu in gpus if all(borrowed(v) for v in gpu.victims)]
    if borrowers_only or (tier and len(tier) < len(gpus)):
        plan = _plan(snap, shape, tier, coming, off) if tier else None
        if plan is not None or borrowers_only:
            return plan
    return _plan(snap, shape, gpus, coming, off)


def _plan(
    snap: Snapshot,
    shape: Shape,
    gpus: list[SharedGpu],
    coming: dict[tuple[int, int], float],
    off: bool = False,
) -> list[SharedGpu] | None:
    """The GPUs to get back so that the gang fits, cut to those it lands on; or None. With
    `off` (the backfill rule keeps the gang off the head's reserved nodes) it must fit off
    them: neither their idle GPUs nor those freed there serve it.

    Node by node, as a gang's units each need one node: on each node its GPUs cheapest
    first, each prefix that gives the node one more unit an option; options cheapest first
    until the gang fits (GPUs being re-cut to whole already count as free). Then, on each
    node the gang lands on, only as many of them as it needs there (the cheapest)."""
    unit = shape.unit_gpus
    by_node: dict[int, list[SharedGpu]] = {}
    for gpu in gpus:
        by_node.setdefault(gpu.index, []).append(gpu)
    with snap.trial() as planning:
        if not off:
            planning.reserved = frozenset()
        for index, gpu_index in coming:
            planning.release(index, 1 << gpu_index)
        free_before = {index: planning.count.get(index, 0) for index in by_node}
        options: list[tuple[float, int, int, list[SharedGpu]]] = []
        for index, here in by_node.items():
            here.sort(key=lambda gpu: (gpu.cost, gpu.gpu))
            free = free_before[index]
            step: list[SharedGpu] = []
            cost = 0.0
            for count, gpu in enumerate(here, start=1):
                step.append(gpu)
                cost += gpu.cost
                if (free + count) // unit > (free + count - len(step)) // unit:
                    options.append((cost, index, count, step))
                    step, cost = [], 0.0
        options.sort(key=lambda option: (option[0], option[1], option[2]))
        chosen: list[SharedGpu] = []
        gone: set[str] = set()
        allocation = None
        tries = 0
        for _, _, _, step in options:
            chosen.extend(step)
            _release(planning, step, gone)
            if planning.total_free < shape.min_gpus:
                continue
            tries += 1
            allocation = find_placement(planning, shape, off)
            if allocation is not None or tries >= MAX_TRIES:
                break
    if allocation is None:
        return None
    units = dict(allocation)
    needed: list[SharedGpu] = []
    for index in by_node:
        want = units.get(index, 0) * unit - free_before[index]
        needed.extend([gpu for gpu in chosen if gpu.index == index][: max(0, want)])
    if len(needed) < len(chosen) and _fits(snap, shape, coming, needed, off):
        return needed
    return chosen


def _release(planning: Snapshot, gpus: list[SharedGpu], gone: set[str]) -> None:
    """The GPUs whole and free in the planning snapshot, their victims gone (each once: its
    CPUs and memory come back)."""
    for gpu in gpus:
        planning.release(gpu.index, 1 << gpu.gpu)
        for victim in gpu.victims:
            if victim.job_id not in gone:
                gone.add(victim.job_id)
                release_gang(planning, victim)


def _fits(
    snap: Snapshot,
    shape: Shape,
    coming: dict[tuple[int, int], float],
    gpus: list[SharedGpu],
    off: bool = False,
) -> bool:
    with snap.trial() as planning:
        if not off:
            planning.reserved = frozenset()
        for index, gpu_index in coming:
            planning.release(index, 1 << gpu_index)
        _release(planning, gpus, set())
        return find_placement(planning, shape, off) is not None


def _coming_whole(ctx: CycleContext) -> dict[tuple[int, int], float]:
    """GPUs on their way back to whole (a re-cut under way, or decided in this cycle), by
    (node index, GPU), with when they serve."""
    trial = ctx.sharing
    assert trial is not None
    ledger = trial.live.ledger
    state = ctx.state
    now = ctx.now
    coming: dict[tuple[int, int], float] = {}
    for node_id in trial.live.sharing_nodes:
        node = ledger.nodes[node_id]
        record = state.node_record(node_id)
        if record is None or not node.schedulable:
            continue
        for gpu in node.gpus:
            if gpu.busy_until > now and not gpu.geometry and gpu.idle and gpu.healthy:
                coming[(record.index, gpu.index)] = gpu.busy_until
    for event in ctx.result.decisions:
        if isinstance(event, GpuGeometryChanged) and not event.geometry:
            record = state.node_record(event.node_id)
            if record is not None:
                coming[(record.index, event.gpu_index)] = now + event.reconfigure_s
    return coming


def _waits_for_recut(
    ctx: CycleContext,
    snap: Snapshot,
    job: CoreJob,
    shape: Shape,
    coming: dict[tuple[int, int], float],
) -> bool:
    """Whether the gang fits once the GPUs going back to whole serve; if so its `why` says
    so, with when (the GPUs it would land on are ready)."""
    with snap.trial() as planning:
        planning.reserved = frozenset()
        for index, gpu_index in coming:
            planning.release(index, 1 << gpu_index)
        allocation = find_placement(planning, shape, False)
    if allocation is None:
        return False
    ready = max(
        (
            coming[(index, gpu)]
            for index, mask in allocation
            for gpu in range(mask.bit_length())
            if mask >> gpu & 1 and (index, gpu) in coming
        ),
        default=None,
    )
    if ready is None:
        return False
    ctx.wakeups.append(ready)
    ctx.outcomes[job.job_id] = Outcome(
        "awaiting_repartition",
        f"{job.need}; GPUs it needs are leaving MIG mode (a re-partition), ready at "
        f"{_clock(ready)}",
    )
    return True


# ---------------------------------------------------------------------- re-cuts


def claim_recuts(ctx: CycleContext, released: list[tuple[str, str, int]]) -> None:
    """The GPUs in MIG mode that this cycle's releases left empty, where the released job was
    evicted for a whole-GPU gang still waiting, go back to whole now (before anything is
    placed, so no slice lands back on them); called as the sharing trial opens, with
    (released job, node, GPU) of each slice it gave back."""
    trial = ctx.sharing
    if trial is None:
        return
    jobs = ctx.state.job_records
    ledger = trial.live.ledger
    for job_id, node_id, gpu_index in released:
        job = jobs.get(job_id)
        preemptor = jobs.get(job.preemptor_id or "") if job is not None else None
        if preemptor is None or preemptor.state not in WAITING_STATES or preemptor.held:
            continue
        if preemptor.job_id in ctx.handled:
            continue  # cancelled or suspended in this very cycle: nobody waits for the GPU
        spec = preemptor.spec
        if spec is None or spec.fractional or spec.gpus_per_task < 1:
            continue
        node = ledger.nodes.get(node_id)
        if node is None or gpu_index >= len(node.gpus):
            continue
        gpu = node.gpus[gpu_index]
        if not gpu.geometry or not gpu.idle or not gpu.healthy or ctx.now < gpu.busy_until:
            continue
        if not node.schedulable or not _may_recut(node, gpu, ctx.now):
            continue
        ready = _emit_recut(ctx, node_id, gpu_index, preemptor)
        if ready is not None:
            # Serves nothing until the cycle ends (the folded event makes it so for real).
            trial.recuts.append((node_id, gpu_index, gpu.busy_until))
            gpu.busy_until = ready
            ledger.changed(node_id)


def _emit_recut(ctx: CycleContext, node_id: str, gpu_index: int, job: CoreJob) -> float | None:
    trial = ctx.sharing
    assert trial is not None
    node = trial.live.ledger.nodes.get(node_id)
    if node is None:
        return None
    gpu = node.gpus[gpu_index]
    ctx.emit(
        GpuGeometryChanged(
            node_id=node_id,
            gpu_index=gpu_index,
            geometry=[],
            previous=[MigInstanceSpec(profile=i.profile, start=i.start) for i in gpu.geometry],
            reconfigure_s=node.reconfigure_s,
            reason=f"a whole GPU for job {job.job_id} (its slices were evicted for it)",
        )
    )
    ready = ctx.now + node.reconfigure_s
    ctx.wakeups.append(ready)
    return ready


def _clock(moment: float) -> str:
    return datetime.fromtimestamp(moment, UTC).strftime("%H:%M:%S UTC")
