"""SLO classes: `inference-critical` work admitted at once, even on a full cluster.

A gang started in under a second cannot wait for its victims' checkpoints (a grace of
minutes), and two gangs never share a whole GPU (invariant 1). So the capacity it starts on
must already be free when it arrives, and the victims pay *after*:

- **Headroom.** The admin keeps `inference_headroom_gpus` free GPUs that no other class may
  take (`headroom_blocks`: a placement of another class that would leave fewer free waits,
  `inference_headroom`). An inference-critical gang lands there at once, in the cycle after
  its admission. The headroom counts in exact fractions (`headroom_free`): free whole GPUs and
  the free compute of MIG GPUs (a free 1g slice of an H100 is 1/7); a slice of another class
  takes its n/7 of it, a share that turns a free GPU soft-shared takes the whole GPU
  (`headroom_refuses`), and an inference slice uses only its part.
- **Refill.** Once it has its GPUs, the headroom is short; `refill_headroom` evicts
  preemptible work to restore it, with the usual checkpoint grace: the victims checkpoint
  *after* the inference job has started. Only borrowed capacity and best-effort work is taken
  (a gang within its queue's guarantee keeps its GPUs: invariant 4 is not traded for
  headroom), never a gang larger than `inference_max_victim_gpus` (bounded blast radius),
  and the gangs with the least work to lose first (GPUs x time since their last checkpoint).
- **Without headroom** (or past it) an inference-critical gang preempts as its class may
  (checkpoint-then-evict, then it starts), under the same blast radius and least-lost-work
  order (`bounded_victims`): it then waits out the grace.

The trade-off (docs/gpu-sharing.md): idle GPUs held for a burst that may not come, against
evicting training without its checkpoint. Gangway keeps the checkpoint and pays in idle
headroom, sized by the operator to the bursts expected; MIG slices and MPS shares (where the
hardware allows) make that headroom a fraction of a GPU per replica.
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction

from core.context import CycleContext, Outcome
from core.live_sharing import GpuAmount
from core.mig import COMPUTE_SLICES
from core.placement import Allocation, Shape, Snapshot
from core.policy import SchedulingPolicy
from core.quota import QuotaBook
from core.sharing import Spot
from core.state import CoreJob
from schemas.jobs import PreemptionRequested
from schemas.reasons import DeferCode

INFERENCE_HEADROOM: DeferCode = "inference_headroom"
REFILL_REASON = "restoring the GPUs kept free for inference-critical work"


def is_inference(job: CoreJob, policy: SchedulingPolicy) -> bool:
    return job.priority == policy.inference_class


def keeps_headroom(ctx: CycleContext, job: CoreJob) -> bool:
    """Whether the job must leave the headroom alone (any class but the inference one)."""
    policy = ctx.policy
    return (
        policy.inference_headroom_gpus > 0 and not policy.is_fifo and not is_inference(job, policy)
    )


def headroom_free(ctx: CycleContext, snap: Snapshot) -> GpuAmount:
    """The capacity the headroom counts free, exactly: free whole GPUs, and the compute of MIG
    GPUs no slice holds (a free 1g slice of an H100 is 1/7 of a GPU). Room left on a
    soft-shared GPU is not counted: only its own team may use it, so it is no headroom for
    an inference job of another team."""
    trial = ctx.sharing
    if trial is None:
        return snap.total_free
    return snap.total_free + trial.free_mig_gpus()


def headroom_blocks(
    ctx: CycleContext,
    snap: Snapshot,
    job: CoreJob,
    shape: Shape,
    allocation: Allocation,
    quota: QuotaBook,
) -> bool:
    """Whether placing `allocation` for a job of another class would eat into the headroom;
    if so, the job's reason says it (and it waits: it is no head and preempts no one).

    A job its queue's guarantee covers may take it (invariant 4: a team always reaches its
    guarantee); the refill then takes the headroom back from borrowed work."""
    if shape.cpu_only or not keeps_headroom(ctx, job):
        return False
    taken = sum(units for _, units in allocation) * shape.unit_gpus
    return eats_headroom(ctx, job, headroom_free(ctx, snap), taken, quota)


def headroom_refuses(
    ctx: CycleContext,
    snap: Snapshot,
    job: CoreJob,
    spots: Sequence[Spot],
    free_before: GpuAmount | None,
    quota: QuotaBook,
) -> bool:
    """`headroom_blocks` for a slice or share job about to bind `spots`, in exact fractions:
    a whole free GPU it turns soft-shared takes 1 from the headroom's count, a slice its
    compute (n/7), a share beside others of its team nothing (that room was not counted)."""
    trial = ctx.sharing
    if free_before is None or trial is None or not keeps_headroom(ctx, job):
        return False
    nodes = trial.live.ledger.nodes
    taken: GpuAmount = 0
    converted: set[tuple[str, int]] = set()
    for spot in spots:
        if spot.mig is not None:
            model = nodes[spot.node_id].model
            if model is not None:
                slices = model.profiles[spot.mig.profile].compute_slices
                taken += Fraction(slices, COMPUTE_SLICES)
            continue
        record = ctx.state.node_record(spot.node_id)
        where = (spot.node_id, spot.gpus[0])
        if record is None or where in converted:
            continue
        if snap.free.get(record.index, 0) >> spot.gpus[0] & 1:
            converted.add(where)
            taken += 1
    return eats_headroom(ctx, job, free_before, taken, quota)


def eats_headroom(
    ctx: CycleContext, job: CoreJob, free: GpuAmount, taken: GpuAmount, quota: QuotaBook
) -> bool:
    """Whether taking `taken` of `free` leaves less than the headroom (and the job's guarantee
    does not cover it); if so the job's reason says it."""
    policy = ctx.policy
    headroom = policy.inference_headroom_gpus
    if not taken or free - taken >= headroom:
        return False
    if job.priority != policy.idle_only_priority and quota.within_guarantee(job.queue, taken):
        return False
    ctx.outcomes[job.job_id] = Outcome(
        INFERENCE_HEADROOM,
        f"{job.need}; the last {headroom} free GPUs are kept for {policy.inference_class} work",
    )
    return True


def lost_work(job: CoreJob, now: float) -> float:
    """GPU-seconds an eviction now would throw away: since the gang's last checkpoint (its
    interval, when it checkpoints), else since it started."""
    started = job.held_since
    if started is None:
        return 0.0
    ran = max(0.0, now - started)
    spec = job.spec
    interval = spec.checkpoint.interval_s if spec is not None else None
    if isinstance(interval, int | float) and interval > 0:
        ran %= interval
    return ran * job.bound_gpus


def bounded_victims(victims: list[CoreJob], now: float, policy: SchedulingPolicy) -> list[CoreJob]:
    """For an inference-critical preemptor: no gang larger than the blast radius, the least
    lost work first (ties: the order given)."""
    limit = policy.inference_max_victim_gpus
    kept = [victim for victim in victims if victim.bound_gpus <= limit]
    order = {victim.job_id: position for position, victim in enumerate(kept)}
    kept.sort(key=lambda victim: (lost_work(victim, now), order[victim.job_id]))
    return kept


def refill_headroom(ctx: CycleContext, snap: Snapshot, quota: QuotaBook) -> None:
    """After placing: evict what the headroom is short of, from borrowed and best-effort
    work only, smallest lost work first, no gang above the blast radius."""
    # Imported here: core.preemption imports this module (bounded_victims).
    from core.preemption import is_protected

    policy, now = ctx.policy, ctx.now
    headroom = policy.inference_headroom_gpus
    if headroom <= 0 or policy.is_fifo or not policy.preemption:
        return
    jobs = ctx.state.holding_jobs
    leaving = sum(
        job.bound_gpus
        for job in jobs.values()
        if job.job_id not in ctx.released
        and (job.state == "preempting" or job.job_id in ctx.handled)
    )
    short = headroom - headroom_free(ctx, snap) - leaving
    if short <= 0:
        return
    top = policy.priority_class(policy.inference_class).rank
    candidates: list[tuple[tuple[int, float, int], CoreJob]] = []
    for job in jobs.values():
        if job.job_id in ctx.handled or not job.bound_gpus:
            continue
        if job.bound_gpus > policy.inference_max_victim_gpus:
            continue
        if policy.priority_class(job.priority).rank >= top:
            continue
        idle_only = job.priority == policy.idle_only_priority
        if not idle_only and quota.borrowing(job.queue) <= 0:
            continue  # within its guarantee: not taken for headroom
        if is_protected(job, now, policy, ctx.wakeups):
            continue
        candidates.append(((0 if idle_only else 1, lost_work(job, now), job.seq), job))
    candidates.sort(key=lambda entry: entry[0])
    for _, victim in candidates:
        if short <= 0:
            break
        if not idle_only_or_still_borrowing(victim, policy, quota):
            continue
        short -= victim.bound_gpus
        quota.charge(victim.queue, -victim.bound_gpus)
        ctx.handled.add(victim.job_id)
        ctx.emit(
            PreemptionRequested(
                job_id=victim.job_id,
                attempt=victim.attempt,
                preemptor_job_id=None,
                reason=f"preempted: {REFILL_REASON}",
                grace_s=policy.preemption_grace_s,
            )
        )
        ctx.result.preemptions += 1


def idle_only_or_still_borrowing(job: CoreJob, policy: SchedulingPolicy, quota: QuotaBook) -> bool:
    """A queue's borrowing shrinks as its gangs are taken: stop at its guarantee."""
    if job.priority == policy.idle_only_priority:
        return True
    return quota.borrowing(job.queue) >= job.bound_gpus
