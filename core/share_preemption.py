"""Preemption for slices and shares: a slice or share job of a class that may preempt, which
found no room, has preemptible slices, shares or small whole-GPU gangs checkpointed and
evicted so that it fits (phase 6 of the cycle, after the whole-GPU planner, before the
inference headroom's refill).

What a victim gives a slice or share:
- a slice job: the slices of its profile that victims hold (a freed MIG instance serves at
  once; a GPU whose geometry would have to change is the re-partition planner's, which only
  cuts idle GPUs: never a GPU it would have to evict);
- a share job: the shares victims hold (a soft-shared GPU whose other shares all leave; one of
  another team leaves whole, since a soft-shared GPU never hosts two teams), or a whole GPU of
  a victim gang, turned soft-shared once the gang is gone.

The rules are those of whole-GPU preemption (core/preemption.py): only a lower class, never a
protected gang (non-preemptible, younger than its minimum runtime, preempted within the
hysteresis), and across queues only what a queue borrows, best-effort work too (invariant 4).
A slice or share never evicts a gang larger than `inference_max_victim_gpus` (the blast
radius: a seventh of a GPU is no ground to stop a 64-GPU gang), and victims with the least
work to lose go first (GPUs x time since their last checkpoint, core/slo.py). The victims
are planned on the cycle's sharing trial and snapshot as if gone, greedily in that order
until the job fits, then cut to those it lands on. They checkpoint within their grace and the
job starts when they are gone (`awaiting_preemption`); an inference-critical slice or share
that must start at once does so from the headroom (core/slo.py), whose refill evicts after.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from core.context import CycleContext
from core.fractional import SharingTrial, describe_fraction, find_spot
from core.host import release_gang
from core.live_sharing import WHOLE_GANG, LiveSharing
from core.placement import Snapshot
from core.preemption import Eviction, credit_leaving, is_protected, request_evictions
from core.quota import QuotaBook
from core.sharing import Spot, TaskAsk, ask_of
from core.slo import lost_work
from core.state import CoreJob
from schemas.jobs import PreemptionRequested

# Slice and share jobs that may preempt in one cycle, and victims tried for each.
MAX_FRACTIONAL_PREEMPTORS = 8
MAX_VICTIMS_TRIED = 32


def preempt_for_fractions(ctx: CycleContext, snap: Snapshot, quota: QuotaBook) -> None:
    """Checkpoint-then-evict victims for the slice and share jobs that found no room."""
    trial = ctx.sharing
    if trial is None or not trial.blocked:
        return
    policy = ctx.policy
    excluded = set(ctx.released) | set(ctx.handled)
    excluded.update(
        event.job_id for event in ctx.result.decisions if isinstance(event, PreemptionRequested)
    )
    preemptors = 0
    # Task types that found no victims this cycle: victims only get scarcer.
    hopeless: set[tuple[object, ...]] = set()
    for job in trial.blocked:
        if preemptors >= MAX_FRACTIONAL_PREEMPTORS:
            break
        spec = job.spec
        if spec is None:
            continue
        if job.awaiting_victims and ctx.victims_pending(job):
            continue
        if ctx.calming(job):
            continue
        pclass = policy.priority_class(job.priority)
        if not pclass.can_preempt or job.priority == policy.idle_only_priority:
            continue
        ask = ask_of(spec)
        key = (ask.mix_key(), ask.team if ask.kind == "share" else "", pclass.rank, job.queue)
        if key in hopeless:
            continue
        credit_leaving(ctx, quota)
        victims = _candidates(ctx, trial, job, ask, pclass.rank, quota, excluded)
        plan = _plan(ctx, snap, trial, ask, spec.tasks, victims) if victims else None
        if plan is None:
            hopeless.add(key)
            continue
        preemptors += 1
        request_evictions(
            ctx,
            job,
            plan,
            Eviction(
                reason=f"preempted for job {job.job_id} (priority {job.priority})",
                code="priority",
                waiting=describe_fraction(spec),
            ),
            quota,
            policy,
        )
        excluded.update(victim.job_id for victim in plan)
        ctx.handled.update(victim.job_id for victim in plan)


def _candidates(
    ctx: CycleContext,
    trial: SharingTrial,
    job: CoreJob,
    ask: TaskAsk,
    rank: int,
    quota: QuotaBook,
    excluded: set[str],
) -> list[CoreJob]:
    """The gangs whose eviction could give this ask room, least lost work first."""
    policy, now = ctx.policy, ctx.now
    live = trial.live
    nodes = ctx.state.node_records
    found: list[tuple[tuple[float, int, int], CoreJob]] = []
    for victim in ctx.state.holding_jobs.values():
        if victim.job_id in excluded or victim.job_id == job.job_id or not victim.ranks:
            continue
        if not victim.bound_gpus or victim.bound_gpus > policy.inference_max_victim_gpus:
            continue
        vrank = policy.priority_class(victim.priority).rank
        if vrank >= rank:
            continue
        same_queue = victim.queue == job.queue
        # Best-effort work too: within its queue's guarantee it is safe from other teams (the
        # auditor's cross_queue rule, as for whole gangs: core/preemption.py's `reachable`).
        if not (same_queue or quota.borrowing(victim.queue) > 0):
            continue  # within its own queue's guarantee: safe from other teams
        if not _gives_room(live, victim, ask, [nodes[index].node_id for index, _ in victim.ranks]):
            continue
        if is_protected(victim, now, policy, ctx.wakeups):
            continue
        found.append(((lost_work(victim, now), vrank, victim.seq), victim))
    found.sort(key=lambda entry: entry[0])
    return [victim for _, victim in found[:MAX_VICTIMS_TRIED]]


def _gives_room(live: LiveSharing, victim: CoreJob, ask: TaskAsk, node_ids: list[str]) -> bool:
    ledger_nodes = live.ledger.nodes
    for spot in live.spots_of(victim.job_id):
        node = ledger_nodes.get(spot.node_id)
        if node is None or not node.of_type(ask):
            continue
        if ask.kind == "mig" and spot.mig is not None and spot.mig.profile == ask.mig_profile:
            return True
        if ask.kind == "share" and spot.mig is None:
            return True
    if ask.kind != "share":
        return False
    for node_id, (_, mask) in zip(node_ids, victim.ranks, strict=True):
        node = ledger_nodes.get(node_id)
        if mask and node is not None and node.mig != "fixed" and node.of_type(ask):
            return True
    return False


def _plan(
    ctx: CycleContext,
    snap: Snapshot,
    trial: SharingTrial,
    ask: TaskAsk,
    tasks: int,
    victims: list[CoreJob],
) -> list[CoreJob] | None:
    """Victims in order until the job's tasks fit, cut to those it lands on; or None."""
    for count in range(1, len(victims) + 1):
        chosen = victims[:count]
        spots = _fits_without(ctx, snap, trial, ask, tasks, chosen)
        if spots is None:
            continue
        landing = {(spot.node_id, spot.gpus[0]) for spot in spots}
        needed = [v for v in chosen if _holds_on(ctx, trial.live, v, landing)]
        trimmed = needed and needed != chosen
        if trimmed and _fits_without(ctx, snap, trial, ask, tasks, needed) is not None:
            return needed
        return chosen
    return None


def _holds_on(
    ctx: CycleContext, live: LiveSharing, victim: CoreJob, landing: set[tuple[str, int]]
) -> bool:
    if any((spot.node_id, spot.gpus[0]) in landing for spot in live.spots_of(victim.job_id)):
        return True
    nodes = ctx.state.node_records
    for index, mask in victim.ranks:
        node_id = nodes[index].node_id
        if any(mask >> gpu & 1 for node, gpu in landing if node == node_id):
            return True
    return False


def _fits_without(
    ctx: CycleContext,
    snap: Snapshot,
    trial: SharingTrial,
    ask: TaskAsk,
    tasks: int,
    victims: list[CoreJob],
) -> list[Spot] | None:
    """Where the job's tasks would go were the victims gone (nothing is changed after)."""
    with snap.trial() as planning, _without(ctx, planning, trial, victims):
        ledger = trial.live.ledger
        holders: list[str] = []
        spots: list[Spot] = []
        try:
            for rank in range(tasks):
                spot = find_spot(ctx, planning, ask)
                if spot is None:
                    return None
                holder = f"(planned):{rank}"
                ledger.bind(holder, ask, spot)
                holders.append(holder)
                spots.append(spot)
                # A GPU turned soft-shared: the next task may share it (as when placing).
                trial.touched.add(spot.node_id)
            return spots
        finally:
            for holder in reversed(holders):
                ledger.release(holder)


@contextmanager
def _without(
    ctx: CycleContext, planning: Snapshot, trial: SharingTrial, victims: list[CoreJob]
) -> Iterator[None]:
    """The victims' slices, shares and whole GPUs free in the ledger and the snapshot, for as
    long as the block runs (the snapshot's own trial undoes its part)."""
    live = trial.live
    ledger = live.ledger
    nodes = ctx.state.node_records
    released: list[tuple[str, TaskAsk, Spot]] = []
    unmarked: list[tuple[str, int]] = []
    try:
        emptied: set[tuple[str, int]] = set()
        for victim in victims:
            for holder in live.by_job.get(victim.job_id, {}).values():
                found = ledger.holders.get(holder)
                if found is not None:
                    ledger.release(holder)
                    released.append((holder, found[0], found[1]))
                    if found[1].gpus:
                        emptied.add((found[1].node_id, found[1].gpus[0]))
            release_gang(planning, victim)
            for index, mask in victim.ranks:
                node = ledger.nodes.get(nodes[index].node_id)
                if node is None or not mask:
                    continue
                for gpu in node.gpus:
                    if mask >> gpu.index & 1 and gpu.whole == WHOLE_GANG:
                        gpu.whole = None
                        unmarked.append((node.node_id, gpu.index))
                        ledger.changed(node.node_id)
        for node_id, gpu_index in sorted(emptied):
            # A soft-shared GPU whose last share left is a whole free GPU again.
            record = ctx.state.node_record(node_id)
            node = ledger.nodes.get(node_id)
            if record is None or node is None:
                continue
            gpu = node.gpus[gpu_index]
            if gpu.idle and not gpu.geometry and gpu.healthy and ctx.now >= gpu.busy_until:
                planning.release(record.index, 1 << gpu.index)
        yield
    finally:
        for node_id, gpu_index in unmarked:
            ledger.nodes[node_id].gpus[gpu_index].whole = WHOLE_GANG
            ledger.changed(node_id)
        for holder, held_ask, spot in reversed(released):
            if holder not in ledger.holders:
                ledger.bind(holder, held_ask, spot)
