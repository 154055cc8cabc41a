"""Slices and shares in the live cycle: MIG slices and soft shares placed through the sharing
ledger, re-partitions decided as events with their cost, and why a slice or share waits.

The cycle (core/cycle.py) opens a `sharing_trial` beside its snapshot of free whole GPUs:
- holds of the gangs this cycle released (ranks that still run aside) are given back, and GPUs
  still being re-partitioned leave the snapshot until their `reconfigure_s` is over (the cycle
  wakes up then);
- `place_fractional` (called by the place phase for a slice or share job, in queue order) binds
  each task of the job to a free MIG instance, or to a soft-shared GPU of the job's own team
  with room, where the held mix's fragmentation grows least (FGD over the best-fit shortlist:
  idle GPUs stay whole for gangs), or else converts a whole free GPU to soft sharing, on the
  node with the fewest free GPUs; the gang is bound whole or not at all, and its GangReserved
  names each rank's slice or share;
- `plan_repartitions` (after placing) asks core/regeometry.py for re-partitions of idle GPUs for
  slices that found no instance, or for a whole GPU back for the blocked head; each is a
  GpuGeometryChanged decision with its cost, and the waiting slices say when it is ready.
Everything the trial binds is undone when the cycle ends: the recorded decisions bind it for
real when they are folded (core/live_sharing.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from fractions import Fraction

from core.context import CycleContext, Outcome
from core.live_sharing import WHOLE_GANG, LiveSharing, holder_of, job_gpus
from core.mig import COMPUTE_SLICES, Geometry, MigModel
from core.placement import Snapshot
from core.quota import QuotaBook
from core.regeometry import hold_s_of, plan_regeometry
from core.sharing import (
    FULL,
    MAX_MPS_CLIENTS_PER_GPU,
    CheapKey,
    NodeLedger,
    Spot,
    TaskAsk,
    ask_of,
    free_thousandths,
    share_memory_mb,
)
from core.sharing_reclaim import claim_recuts
from core.slo import eats_headroom, headroom_free, headroom_refuses, keeps_headroom
from core.state import CoreJob
from schemas.jobs import GangReserved, GpuShare, JobSpec, MigSlice, RankPlacement

# Waiting slice tasks a cycle plans re-partitions for (the first in queue order).
MAX_SLICES_PLANNED = 64


@dataclass(slots=True)
class SharingTrial:
    """One cycle's tentative changes to the sharing ledger, undone when the cycle ends."""

    live: LiveSharing
    now: float
    bound: list[str] = field(default_factory=list)
    released: list[tuple[str, TaskAsk, Spot]] = field(default_factory=list)
    # Task types that found no spot this cycle (capacity only shrinks while placing).
    failed: set[tuple[object, ...]] = field(default_factory=set)
    # Slice jobs that found no instance: (job, ask, tasks left), for re-partitioning.
    unplaced_slices: list[tuple[CoreJob, TaskAsk, int]] = field(default_factory=list)
    # Nodes where this cycle made a GPU soft-shared (not yet among the live sharing nodes).
    touched: set[str] = field(default_factory=set)
    # GPUs of whole gangs this cycle released: idle in the ledger until the cycle ends.
    unmarked: list[tuple[str, int]] = field(default_factory=list)
    # Answers that hold for the whole cycle, asked by many waiting jobs of few kinds: why a
    # kind of task waits, why it could never fit, when the first hysteresis hold ends.
    reasons: dict[tuple[object, ...], Outcome] = field(default_factory=dict)
    never: dict[tuple[object, ...], str | None] = field(default_factory=dict)
    hold_ends: list[float | None] = field(default_factory=list)
    # Share kinds the inference headroom refused this cycle, with the reason given.
    headroom_refused: dict[tuple[object, ...], Outcome] = field(default_factory=dict)
    # Slice and share jobs that found no room this cycle, in queue order (preemption may make
    # room: core/share_preemption.py).
    blocked: list[CoreJob] = field(default_factory=list)
    # (binds so far, free MIG capacity then): the headroom's count, kept while nothing binds.
    _mig_free: tuple[int, Fraction] | None = None
    # Whole free GPUs this cycle decided to cut (out of the snapshot, not yet in the ledger):
    # the headroom still counts them free, as it counts GPUs being re-partitioned.
    cut_whole: int = 0
    # GPUs emptied by evictions for a whole-GPU gang and re-cut to whole in this cycle
    # (core/sharing_reclaim.py): (node, GPU, its busy_until before), busy until the cycle ends.
    recuts: list[tuple[str, int, float]] = field(default_factory=list)
    # The head's reserved node indices and their ids (core/fractional.py `_pinned_nodes`).
    pinned: tuple[frozenset[int], frozenset[str]] | None = None

    def note_bound(self, holders: list[str], spots: list[Spot]) -> None:
        """A job's holds, kept until the cycle ends; the free MIG count follows its slices
        (counting again would read every shared GPU once per placement)."""
        cached = self._mig_free
        self.bound.extend(holders)
        if cached is None or cached[0] != len(self.bound) - len(holders):
            return
        nodes = self.live.ledger.nodes
        free = cached[1]
        for spot in spots:
            model = nodes[spot.node_id].model
            if spot.mig is not None and model is not None:
                compute = model.profiles[spot.mig.profile].compute_slices
                free -= Fraction(compute, COMPUTE_SLICES)
        self._mig_free = (len(self.bound), free)

    def free_mig_gpus(self) -> Fraction:
        """The free MIG capacity now, exactly (LiveSharing.free_mig_gpus), kept until a bind."""
        cached = self._mig_free
        if cached is None or cached[0] != len(self.bound):
            cached = (len(self.bound), self.live.free_mig_gpus(self.sharing_nodes(), self.now))
            self._mig_free = cached
        return cached[1] + self.cut_whole

    def sharing_nodes(self) -> set[str]:
        return self.live.sharing_nodes | self.touched if self.touched else self.live.sharing_nodes


@contextmanager
def sharing_trial(ctx: CycleContext, snap: Snapshot) -> Iterator[SharingTrial]:
    live = ctx.state.sharing
    ledger = live.ledger
    trial = SharingTrial(live, ctx.now)
    ctx.sharing = trial
    jobs = ctx.state.job_records
    try:
        # Slices given back by this cycle's releases: (job, node, GPU), for re-cuts to whole.
        emptied: list[tuple[str, str, int]] = []
        for job_id in sorted(ctx.released):
            job = jobs[job_id]
            _release_whole(ctx, trial, job)
            holders = live.by_job.get(job_id)
            if not holders:
                continue
            for rank, holder in sorted(holders.items()):
                found = ledger.holders.get(holder)
                if found is None or job.still_runs(rank):
                    continue
                ledger.release(holder)
                trial.released.append((holder, found[0], found[1]))
                _whole_again(ctx, snap, trial, found[1])
                if found[1].mig is not None:
                    emptied.append((job_id, found[1].node_id, found[1].gpus[0]))
        if emptied:
            claim_recuts(ctx, emptied)
        for node_id in sorted(live.sharing_nodes):
            node = ledger.nodes[node_id]
            record = ctx.state.node_record(node_id)
            if record is None:
                continue
            for gpu in node.gpus:
                if gpu.busy_until > ctx.now:
                    # Being re-partitioned: it serves nothing, not even as a whole GPU.
                    ctx.wakeups.append(gpu.busy_until)
                    free = snap.free.get(record.index, 0)
                    if free >> gpu.index & 1:
                        snap.set_free(record.index, free & ~(1 << gpu.index))
        yield trial
    finally:
        for node_id, gpu_index, busy_until in reversed(trial.recuts):
            ledger.nodes[node_id].gpus[gpu_index].busy_until = busy_until
            ledger.changed(node_id)
        for node_id, gpu_index in trial.unmarked:
            ledger.nodes[node_id].gpus[gpu_index].whole = WHOLE_GANG
            ledger.changed(node_id)
        for holder in reversed(trial.bound):
            ledger.release(holder)
        for holder, ask, spot in reversed(trial.released):
            if holder not in ledger.holders:
                ledger.bind(holder, ask, spot)
        ctx.sharing = None


def _whole_again(ctx: CycleContext, snap: Snapshot, trial: SharingTrial, spot: Spot) -> None:
    """A soft-shared GPU whose last share this cycle released is a whole free GPU in this very
    cycle (the state's masks say so only once the release is folded)."""
    if spot.mig is not None or not spot.gpus:
        return
    node = trial.live.ledger.nodes.get(spot.node_id)
    record = ctx.state.node_record(spot.node_id)
    if node is None or record is None:
        return
    gpu = node.gpus[spot.gpus[0]]
    if gpu.idle and not gpu.geometry and gpu.healthy and ctx.now >= gpu.busy_until:
        snap.release(record.index, 1 << gpu.index)


def _release_whole(ctx: CycleContext, trial: SharingTrial, job: CoreJob) -> None:
    """The whole GPUs of a gang this cycle released are idle in the ledger too (re-geometry
    may cut them in this cycle), but for ranks that still run there."""
    nodes = ctx.state.node_records
    ledger = trial.live.ledger
    for rank, (index, mask) in enumerate(job.ranks):
        if not mask or job.still_runs(rank):
            continue
        node = ledger.nodes.get(nodes[index].node_id)
        if node is None:
            continue
        for gpu in node.gpus:
            if mask >> gpu.index & 1 and gpu.whole == WHOLE_GANG:
                gpu.whole = None
                trial.unmarked.append((node.node_id, gpu.index))
                ledger.changed(node.node_id)


# ---------------------------------------------------------------------- placing


def place_fractional(
    ctx: CycleContext,
    snap: Snapshot,
    job: CoreJob,
    quota: QuotaBook,
    *,
    enforce_quota: bool,
    behind_head: bool,
    budget_left: bool,
) -> bool:
    """Place a slice or share job whole, or say why it waits. True when it was bound."""
    spec = job.spec
    trial = ctx.sharing
    if spec is None or trial is None:
        return False
    need = describe_fraction(spec)
    outcomes = ctx.outcomes
    amount = job_gpus(spec)
    if enforce_quota:
        hit = quota.ceiling_hit(job.queue, amount)
        if hit is not None:
            name, ceiling = hit
            outcomes[job.job_id] = Outcome(
                "quota_ceiling", f"{need}; queue {name} would exceed its ceiling of {ceiling} GPUs"
            )
            return False
    if behind_head:
        outcomes[job.job_id] = Outcome(
            "behind_head", f"{need}; waiting behind the first job in line (backfill is off)"
        )
        return False
    kind = (spec.mig_profile, spec.gpu_fraction is not None, spec.gpu_type, spec.gpu_memory_mb)
    if kind not in trial.never:
        trial.never[kind] = _never_fits(trial.live, spec)
    never = trial.never[kind]
    if never is not None:
        outcomes[job.job_id] = Outcome("unsatisfiable", f"{need}; {never}")
        return False
    if not budget_left:
        outcomes[job.job_id] = Outcome(
            "cycle_budget", f"{need}; placement deferred to the next cycle"
        )
        return False
    ask = ask_of(spec)
    ledger = trial.live.ledger
    key = (ask.mix_key(), ask.team if ask.kind == "share" else "")
    spots: list[Spot] = []
    holders: list[str] = []
    attempt = job.attempt + 1
    # What the inference headroom counts free before this job binds (core/slo.py).
    free_before = headroom_free(ctx, snap) if keeps_headroom(ctx, job) else None
    if free_before is not None:
        # What the headroom would lose is known before looking for spots for a slice job
        # (n/7 a slice); a share refused once this cycle is refused again (room only shrinks).
        if ask.kind == "mig" and eats_headroom(ctx, job, free_before, amount, quota):
            # An idle GPU may still be cut for it (a GPU being cut counts free): the
            # headroom then holds free slices, which an inference slice takes at once.
            trial.unplaced_slices.append((job, ask, spec.tasks))
            return False
        refused = trial.headroom_refused.get((key, job.queue, job.priority))
        if refused is not None:
            outcomes[job.job_id] = refused
            return False
    # Behind the head, never on the nodes its reservation pins (as a gang that would delay
    # it): a slice or share there may outlive the start the reservation was planned for.
    pinned = _pinned_nodes(ctx, snap) if ctx.result.head_job_id is not None else frozenset()
    # (A job avoiding pinned nodes failing says nothing of one that may use them.)
    failed_key = (*key, pinned) if pinned else key
    if failed_key not in trial.failed:
        for rank in range(spec.tasks):
            spot = find_spot(ctx, snap, ask, avoid_nodes=pinned)
            if spot is None:
                break
            holder = holder_of(job.job_id, attempt, rank)
            ledger.bind(holder, ask, spot)
            holders.append(holder)
            spots.append(spot)
            trial.touched.add(spot.node_id)
    if (
        ask.kind == "share"
        and len(spots) == spec.tasks
        and headroom_refuses(ctx, snap, job, spots, free_before, quota)
    ):
        for holder in holders:
            ledger.release(holder)
        trial.headroom_refused[(key, job.queue, job.priority)] = outcomes[job.job_id]
        return False
    if len(spots) < spec.tasks:
        for holder in holders:
            ledger.release(holder)
        trial.failed.add(failed_key)
        if pinned and find_spot(ctx, snap, ask) is not None:
            # Room on the nodes the head's reservation pins: it waits for the head (and evicts
            # no one for room it has).
            outcomes[job.job_id] = Outcome(
                "backfill_blocked",
                f"{need}; the GPUs with room are on nodes held for the reservation of the "
                "first job in line",
            )
            return False
        trial.blocked.append(job)
        if ask.kind == "mig":
            trial.unplaced_slices.append((job, ask, spec.tasks))
        reason_key = (key, need)
        if reason_key not in trial.reasons:
            trial.reasons[reason_key] = _why_waiting(ctx, ask, need)
        outcomes[job.job_id] = trial.reasons[reason_key]
        return False
    trial.note_bound(holders, spots)
    nodes_by_id = {spot.node_id: ctx.state.node_record(spot.node_id) for spot in spots}
    for spot in spots:
        record = nodes_by_id[spot.node_id]
        if record is None:
            continue
        free = snap.free.get(record.index, 0)
        if free >> spot.gpus[0] & 1:
            # A whole free GPU became soft-shared: out of the whole-GPU pool.
            snap.set_free(record.index, free & ~(1 << spot.gpus[0]))
    ctx.emit(
        GangReserved.model_construct(
            job_id=job.job_id,
            attempt=attempt,
            ranks=[_rank(rank, spot, ask) for rank, spot in enumerate(spots)],
        )
    )
    quota.charge(job.queue, amount)
    ctx.result.gangs_placed += 1
    ctx.result.tasks_placed += len(spots)
    return True


def _rank(rank: int, spot: Spot, ask: TaskAsk) -> RankPlacement:
    mig = share = None
    if spot.mig is not None:
        mig = MigSlice.model_construct(profile=spot.mig.profile, start=spot.mig.start)
    else:
        share = GpuShare.model_construct(
            thousandths=spot.thousandths, memory_mb=spot.gpu_memory_mb, sharing=ask.sharing
        )
    return RankPlacement.model_construct(
        rank=rank, node_id=spot.node_id, gpus=list(spot.gpus), mig=mig, share=share
    )


def _pinned_nodes(ctx: CycleContext, snap: Snapshot) -> frozenset[str]:
    """The nodes the head's reservation pins, by id (kept while the reservation is the same:
    many slice and share jobs may ask in one cycle)."""
    trial = ctx.sharing
    reserved = snap.reserved
    if trial is not None and trial.pinned is not None and trial.pinned[0] is reserved:
        return trial.pinned[1]
    nodes = ctx.state.node_records
    pinned = frozenset(nodes[index].node_id for index in reserved)
    if trial is not None:
        trial.pinned = (reserved, pinned)
    return pinned


def find_spot(
    ctx: CycleContext, snap: Snapshot, ask: TaskAsk, avoid_nodes: frozenset[str] = frozenset()
) -> Spot | None:
    """Where one slice or share task goes now, or None.

    A free instance of its profile, or a soft-shared GPU of its team with room. Ranked best
    fit (the fullest GPU first, then the node with the fewest idle GPUs: idle GPUs and nodes
    stay whole for gangs); with `sharing_packing: fgd` (the default) the first
    `sharing_shortlist` of them are scored by FGD and the task goes where the fragmentation of
    the held mix grows least (ties: best-fit order). A share with no such GPU converts a whole
    free GPU (`_convert`): the last resort under either packing."""
    trial = ctx.sharing
    if trial is None:
        return None
    ledger = trial.live.ledger
    now = ctx.now
    fgd = ctx.policy.sharing_packing == "fgd"
    # The ledger's free-capacity index ranks the spots reading a few nodes (core/
    # sharing_index.py); an idle GPU offers a share too, ranked last (all of it free): that is
    # a conversion, the last resort below, which keeps the head's reservation.
    first = max(1, ctx.policy.sharing_shortlist) if fgd else 1
    ranked: list[tuple[CheapKey, Spot]] = []
    for key, spot in ledger.ranked(ask, now):
        if ask.kind == "share" and key[0] >= FULL:
            break  # idle GPUs from here on (all of them free)
        if spot.node_id in avoid_nodes:
            continue
        ranked.append((key, spot))
        if len(ranked) >= first:
            break
    if len(ranked) > 1:
        # FGD over the best-fit shortlist: where the held mix's fragmentation grows least.
        spots = [spot for _, spot in ranked]
        return ledger.least_fragmenting(ask, spots, ledger.mix_with(ask), now)
    if ranked:
        return ranked[0][1]
    if ask.kind == "share":
        return _convert(ctx, snap, ask)
    return None


def _convert(ctx: CycleContext, snap: Snapshot, ask: TaskAsk) -> Spot | None:
    """A whole free GPU for a new soft-shared GPU: on the node with the fewest free GPUs (best
    fit), its lowest free GPU, never on a node the head's reservation pins."""
    trial = ctx.sharing
    if trial is None:
        return None
    ledger = trial.live.ledger
    nodes = ctx.state.node_records
    pools = sorted(snap.levels)
    for count in range(1, 65):
        candidates: list[int] = []
        for pool in pools:
            levels = snap.levels[pool]
            if count < len(levels):
                candidates.extend(levels[count])
        for index in sorted(candidates):
            if index in snap.reserved:
                continue
            record = nodes[index]
            node = ledger.nodes.get(record.node_id)
            if node is None or node.mig == "fixed" or not node.of_type(ask):
                continue
            if not node.fits_host(ask):
                continue
            free = snap.free.get(index, 0)
            for gpu in node.gpus:
                if not free >> gpu.index & 1 or gpu.geometry or not gpu.idle:
                    continue
                memory = share_memory_mb(ask, gpu)
                if memory > gpu.memory_mb:
                    continue
                return Spot(
                    record.node_id,
                    (gpu.index,),
                    thousandths=ask.thousandths,
                    gpu_memory_mb=memory,
                )
    return None


# ---------------------------------------------------------------------- re-partitions


def plan_repartitions(ctx: CycleContext, snap: Snapshot, blocked: list[CoreJob]) -> None:
    """Re-partition idle GPUs for slices that found no instance, or give a whole GPU back to
    the blocked head; each decision is a GpuGeometryChanged with its cost."""
    trial = ctx.sharing
    if trial is None:
        return
    live = trial.live
    ledger = live.ledger
    # The first waiting slice tasks in queue order: a re-partition plan costs about the square
    # of the slices it looks at, and the rest wait a cycle or two more (a cut takes longer).
    asks = [ask for _, ask, tasks in trial.unplaced_slices for _ in range(tasks)]
    asks = asks[:MAX_SLICES_PLANNED]
    # The first whole-GPU job that found no GPUs: an idle MIG GPU may go back to whole for it.
    first = next((job for job in blocked if job.spec is not None and not job.spec.fractional), None)
    spec = first.spec if first is not None else None
    wants_whole = spec is not None and spec.gpus_per_task > 0 and _idle_mig_gpus(ctx, live)
    if spec is not None and wants_whole:
        asks.append(
            TaskAsk(
                spec.team,
                whole_gpus=spec.gpus_per_task,
                gpu_types=(spec.gpu_type,) if spec.gpu_type else (),
            )
        )
    if not asks:
        return
    decisions = plan_regeometry(ledger, asks, ctx.now)
    # Decided in this cycle, not folded yet: (node, GPU) → (geometry, ready at).
    decided: dict[tuple[str, int], tuple[Geometry, float]] = {}
    for decision in decisions:
        record = ctx.state.node_record(decision.node_id)
        if record is None:
            continue
        bit = 1 << decision.gpu_index
        free = snap.free.get(record.index, 0)
        if not decision.previous:
            # A whole GPU: only if no gang took it in this very cycle, nor the head pins it.
            if not free & bit or record.index in snap.reserved:
                continue
            snap.set_free(record.index, free & ~bit)
            trial.cut_whole += 1
        ctx.emit(decision.event())
        ready = ctx.now + decision.reconfigure_s
        ctx.wakeups.append(ready)
        decided[(decision.node_id, decision.gpu_index)] = (decision.geometry, ready)
    if wants_whole and not any(not geometry for geometry, _ in decided.values()):
        held_until = _hold_ends(ctx, trial)
        if held_until is not None:
            ctx.wakeups.append(held_until)
    _explain_slices(ctx, trial, decided)


def _idle_mig_gpus(ctx: CycleContext, live: LiveSharing) -> bool:
    for node_id in live.sharing_nodes:
        node = live.ledger.nodes[node_id]
        if node.mig != "dynamic" or not node.schedulable:
            continue
        if any(gpu.geometry and gpu.idle and gpu.busy_until <= ctx.now for gpu in node.gpus):
            return True
    return False


def _explain_slices(
    ctx: CycleContext, trial: SharingTrial, decided: dict[tuple[str, int], tuple[Geometry, float]]
) -> None:
    """The waiting slices served by a re-partition (decided now, or under way) say so, with
    when it is ready; the others keep the reason placing gave them."""
    ledger = trial.live.ledger
    # Free instances a re-partition will bring, by profile: (ready at, node, GPU) each.
    coming: dict[str, list[tuple[float, str, int]]] = {}
    under_way = {
        (node_id, gpu.index): (gpu.geometry, gpu.busy_until)
        for node_id in trial.live.sharing_nodes
        for gpu in ledger.nodes[node_id].gpus
        if gpu.busy_until > ctx.now
    }
    for (node_id, gpu_index), (geometry, ready) in sorted({**under_way, **decided}.items()):
        gpu = ledger.nodes[node_id].gpus[gpu_index]
        for instance in geometry:
            if instance.start not in gpu.slices:
                coming.setdefault(instance.profile, []).append((ready, node_id, gpu_index))
    for entries in coming.values():
        entries.sort()
    for job, ask, tasks in trial.unplaced_slices:
        entries = coming.get(ask.mig_profile or "", [])
        if len(entries) < tasks:
            continue
        taken, coming[ask.mig_profile or ""] = entries[:tasks], entries[tasks:]
        ready, node_id, gpu_index = taken[-1]
        spec = job.spec
        if spec is None:
            continue
        ctx.outcomes[job.job_id] = Outcome(
            "awaiting_repartition",
            f"{describe_fraction(spec)}; a re-partition of {node_id} GPU {gpu_index} "
            f"is planned, ready at {_clock(ready)}",
        )


# ---------------------------------------------------------------------- why


def describe_fraction(spec: JobSpec) -> str:
    """'needs a 2g.20gb slice', 'needs 4 0.25 shares of a GPU (mps, 4 tasks)'."""
    tasks = spec.tasks
    if spec.mig_profile is not None:
        if tasks == 1:
            return f"needs a {spec.mig_profile} slice"
        return f"needs {tasks} {spec.mig_profile} slices ({tasks} tasks)"
    fraction = f"{spec.gpu_thousandths / FULL:g}"
    how = spec.sharing or "mps"
    if tasks == 1:
        return f"needs a {fraction} share of a GPU ({how})"
    return f"needs {tasks} {fraction} shares of a GPU ({how}, {tasks} tasks)"


def _never_fits(live: LiveSharing, spec: JobSpec) -> str | None:
    """Why no node of the cluster as registered could ever hold one task (None: some could)."""
    ask = ask_of(spec)
    nodes = [node for node in live.ledger.nodes.values() if node.of_type(ask)]
    if not nodes:
        return f"the cluster has no {spec.gpu_type} GPUs"
    if spec.mig_profile is not None:
        if not any(_offers(node, spec.mig_profile) for node in nodes):
            return (
                f"no node offers {spec.mig_profile} slices (no GPU model with that profile "
                "in MIG mode: mig dynamic, or a fixed geometry holding it)"
            )
        return None
    if not any(node.mig != "fixed" for node in nodes):
        return "every GPU of that kind has a fixed MIG geometry: none can be soft-shared"
    if spec.gpu_memory_mb is not None:
        # gpu_spots never offers a share more memory than its GPU has, so such an ask would
        # wait forever under a reason about busy GPUs or another team's shares.
        largest = max(
            (gpu.memory_mb for node in nodes if node.mig != "fixed" for gpu in node.gpus),
            default=0,
        )
        if spec.gpu_memory_mb > largest:
            return (
                f"a share asks {spec.gpu_memory_mb} MB of GPU memory but the largest GPU "
                f"that can be soft-shared has {largest} MB"
            )
    return None


def _offers(node: NodeLedger, profile: str) -> bool:
    if node.model is None or profile not in node.model.profiles:
        return False
    if node.mig == "dynamic":
        return True
    return node.mig == "fixed" and any(
        instance.profile == profile for gpu in node.gpus for instance in gpu.geometry
    )


def _why_waiting(ctx: CycleContext, ask: TaskAsk, need: str) -> Outcome:
    trial = ctx.sharing
    assert trial is not None
    ledger = trial.live.ledger
    if ask.kind == "mig":
        profile = ask.mig_profile or ""
        slots: dict[str, str] = {}
        for node in ledger.nodes.values():
            if _offers(node, profile) and node.of_type(ask) and node.model is not None:
                slots.setdefault(node.gpu_type, _slots_text(node.model, profile))
        where = "; ".join(
            f"no {gpu_type} has slots {text} free" for gpu_type, text in sorted(slots.items())
        )
        message = f"{need}; {where or 'no free instance'}"
        held_until = _hold_ends(ctx, trial)
        if held_until is not None:
            ctx.wakeups.append(held_until)
            message += (
                f"; no idle GPU may be re-partitioned before {_clock(held_until)} (a geometry "
                "is kept a while, so that GPUs do not flap between layouts)"
            )
        else:
            message += "; no idle GPU may be re-partitioned now"
        return Outcome("no_mig_slice", message)
    # A share: the GPUs with the thousandths it asks, which another team or a full MPS
    # server holds.
    roomy = [
        gpu
        for node in map(ledger.nodes.__getitem__, trial.sharing_nodes())
        if node.of_type(ask) and node.schedulable
        for gpu in node.gpus
        if free_thousandths(node, gpu, ctx.now) >= ask.thousandths
    ]
    room_with_others = any(gpu.share_team not in (None, ask.team) for gpu in roomy)
    # Which teams, how many of them and how many of its tasks found no room are not said:
    # who else runs where is not the waiting team's business (the node view hides other
    # teams' jobs too), and such counts change as shares come and go while the fact the job
    # waits for stays the same: each change was a new reason, an event.
    if room_with_others:
        return Outcome(
            "share_other_team",
            f"{need}; no GPU has room: the GPUs with room are each soft-shared by another "
            "team, and a soft-shared GPU hosts one team",
        )
    clients_full = ask.sharing == "mps" and any(
        gpu.share_team == ask.team and not gpu.takes_client(ask) for gpu in roomy
    )
    room = (
        f"room for another MPS client ({MAX_MPS_CLIENTS_PER_GPU} a GPU)"
        if clients_full
        else f"{ask.thousandths}/1000 free"
    )
    return Outcome(
        "no_gpu_share",
        f"{need}; no soft-shared GPU of team {ask.team} has {room} and "
        "no whole GPU is free to share",
    )


def _slots_text(model: MigModel, profile: str) -> str:
    """'0-1, 2-3 or 4-5': the slot ranges where the profile may start."""
    ranges = [
        str(start) if size == 1 else f"{start}-{start + size - 1}"
        for start, size in model.profiles[profile].placements
    ]
    if len(ranges) == 1:
        return ranges[0]
    return f"{', '.join(ranges[:-1])} or {ranges[-1]}"


def _hold_ends(ctx: CycleContext, trial: SharingTrial) -> float | None:
    """When the first idle GPU of a dynamic node kept by hysteresis may be re-partitioned."""
    if not trial.hold_ends:
        trial.hold_ends.append(_first_hold_end(ctx, trial))
    return trial.hold_ends[0]


def _first_hold_end(ctx: CycleContext, trial: SharingTrial) -> float | None:
    soonest: float | None = None
    for node_id in trial.live.sharing_nodes:
        node = trial.live.ledger.nodes[node_id]
        if node.mig != "dynamic" or node.model is None or not node.schedulable:
            continue
        hold = hold_s_of(node, None)
        for gpu in node.gpus:
            changed = gpu.geometry_changed_at
            if not gpu.idle or changed is None or ctx.now - changed >= hold:
                continue
            ends = changed + hold
            soonest = ends if soonest is None else min(soonest, ends)
    return soonest


def _clock(moment: float) -> str:
    return datetime.fromtimestamp(moment, UTC).strftime("%H:%M:%S UTC")
