"""Fill mode (`gangway simulate --no-departures`): how much of a cluster a packing policy can
allocate, the way the FGD paper (Weng et al., ATC'23) compares policies.

Jobs arrive in trace order and never finish; each is placed whole (every task, or none) on the
sharing ledger (core/sharing.py) by the packing policy, or waits. Waiting slices of `mig:
dynamic` nodes may get a re-partitioned idle GPU (core/regeometry.py), usable after its
`reconfigure_s`. Arrivals go on until the GPU demand that arrived reaches `fill_until` times
the cluster's GPU capacity (or the trace ends). Reported:
- `allocated_share_at_full_demand`: the share of GPU capacity allocated when the arrived GPU
  demand first reaches 100% of capacity (null if the trace never gets there);
- `fragmentation`: a time series of the cluster's fragmentation (the share of free GPU
  capacity the recent mix of requests cannot use), with the arrived demand and the allocation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from fractions import Fraction
from typing import Any

from core.mig import MIG_MODELS
from core.regeometry import apply_decision, plan_regeometry
from core.sharing import Packing, RecentMix, SharingLedger, Spot, TaskAsk, ask_of
from gangway.simulator.trace import TraceJob
from schemas.nodes import NodeRegistered

SAMPLES = 200  # points of the fragmentation series, at most (plus the full-demand one)


@dataclass(slots=True)
class _Waiting:
    job: TraceJob
    asks: list[TaskAsk]


@dataclass(slots=True)
class FillResult:
    jobs: int
    placed_jobs: int
    waiting_jobs: int
    capacity_gpus: int
    arrived_demand_share: float
    allocated_share: float
    allocated_share_at_full_demand: float | None
    fragmentation: list[dict[str, float]] = field(default_factory=list)
    geometry_changes: int = 0
    invariant_violations: int = 0
    makespan_s: float = 0.0

    def as_json(self) -> dict[str, Any]:
        return {
            "jobs": self.jobs,
            "placed_jobs": self.placed_jobs,
            "waiting_jobs": self.waiting_jobs,
            "capacity_gpus": self.capacity_gpus,
            "arrived_demand_share": self.arrived_demand_share,
            "allocated_share": self.allocated_share,
            "allocated_share_at_full_demand": self.allocated_share_at_full_demand,
            "fragmentation": self.fragmentation,
            "geometry_changes": self.geometry_changes,
            "invariant_violations": self.invariant_violations,
            "makespan_s": self.makespan_s,
        }


def task_asks(job: TraceJob) -> list[TaskAsk]:
    """The job's tasks as the ledger sees them, with the trace's GPU type alternatives."""
    return [replace(ask_of(job.spec), gpu_types=job.gpu_types)] * job.spec.tasks


def gpu_demand(asks: Sequence[TaskAsk]) -> Fraction:
    """The GPU capacity the tasks ask, exactly (a slice: its compute slices of 7)."""
    total = Fraction(0)
    for ask in asks:
        if ask.kind == "whole":
            total += ask.whole_gpus
        elif ask.kind == "share":
            total += Fraction(ask.thousandths, 1000)
        elif ask.kind == "mig" and ask.mig_profile is not None:
            slices = next(
                (
                    model.profiles[ask.mig_profile].compute_slices
                    for model in MIG_MODELS.values()
                    if ask.mig_profile in model.profiles
                ),
                7,
            )
            total += Fraction(slices, 7)
    return total


def run_fill(
    jobs: Sequence[TraceJob],
    nodes: Sequence[NodeRegistered],
    *,
    packing: Packing = "fgd",
    fill_until: float = 1.0,
) -> FillResult:
    ledger = SharingLedger()
    for node in nodes:
        ledger.register(node)
    capacity = sum(len(node.gpus) for node in nodes)
    mix = RecentMix()
    waiting: list[_Waiting] = []
    demand = Fraction(0)
    placed = 0
    changes = 0
    at_full: float | None = None
    series: list[dict[str, float]] = []
    every = max(1, len(jobs) // SAMPLES)
    now = 0.0
    arrived = 0
    for number, job in enumerate(jobs):
        if demand >= capacity * Fraction(fill_until):
            break
        arrived += 1
        now = job.submit_s
        asks = task_asks(job)
        for ask in asks[:1]:
            mix.note(ask)
        demand += gpu_demand(asks)
        # Re-partitions for slices that wait, then the slices that wait and now fit (nothing
        # else can fit later: nothing departs), then the job.
        slices = [ask for entry in waiting for ask in entry.asks if ask.kind == "mig"]
        for decision in plan_regeometry(ledger, slices, now):
            apply_decision(ledger, decision, now)
            changes += 1
        still: list[_Waiting] = []
        for entry in waiting:
            if entry.asks[0].kind == "mig" and _place_gang(
                ledger, entry.job, entry.asks, now, mix, packing
            ):
                placed += 1
            else:
                still.append(entry)
        waiting = still
        if _place_gang(ledger, job, asks, now, mix, packing):
            placed += 1
        else:
            waiting.append(_Waiting(job, asks))
        allocated = float(ledger.allocated_gpus() / capacity)
        full = at_full is None and demand >= capacity
        if full:
            at_full = allocated
        if full or number % every == 0:
            series.append(
                {
                    "time_s": now,
                    "arrived_demand_share": float(demand / capacity),
                    "allocated_share": allocated,
                    "fragmentation": ledger.fragmentation(mix.weights(), now),
                }
            )
    return FillResult(
        jobs=arrived,
        placed_jobs=placed,
        waiting_jobs=len(waiting),
        capacity_gpus=capacity,
        arrived_demand_share=float(demand / capacity),
        allocated_share=float(ledger.allocated_gpus() / capacity),
        allocated_share_at_full_demand=at_full,
        fragmentation=series,
        geometry_changes=changes,
        invariant_violations=len(ledger.problems()),
        makespan_s=now - (jobs[0].submit_s if jobs else 0.0),
    )


def _place_gang(
    ledger: SharingLedger,
    job: TraceJob,
    asks: Sequence[TaskAsk],
    now: float,
    mix: RecentMix,
    packing: Packing,
) -> bool:
    """Every task of the job placed, or none (a gang is never half-bound)."""
    weights = mix.weights()
    bound: list[str] = []
    for rank, ask in enumerate(asks):
        spot: Spot | None = ledger.place(ask, now, weights, packing=packing)
        if spot is None:
            for holder in bound:
                ledger.release(holder)
            return False
        holder = f"{job.job_id}:{rank}"
        ledger.bind(holder, ask, spot)
        bound.append(holder)
    return True
