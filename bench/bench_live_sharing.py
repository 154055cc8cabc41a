"""Slices and shares in the live cycle: how fast the scheduling cycle places them, FGD against
best fit (policy `sharing_packing`), and how much of the free capacity each strands.

A cluster of 8-GPU H100 nodes, half `mig: dynamic` and cut into seven 1g.10gb instances per GPU
up front (placement is measured here, not re-geometry), half without MIG. Jobs of one task
arrive all at once: half shares of one GPU (0.1, 0.25, 0.3 or 0.5, MPS) and half 1g.10gb
slices, of eight teams; then cycles run (each decision folded back, as the scheduler service
does) until every job is placed or a cycle places none. Reported: placements per second of
cycle time (wall and CPU), the slowest cycle, how many whole GPUs were turned soft-shared, and
the cluster's fragmentation at the end (the share of free capacity the held mix cannot use:
about half by construction here, since shares cannot use MIG GPUs nor slices plain ones).

Run: `python bench/bench_live_sharing.py [--nodes 1000] [--jobs 4000]`.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path
from typing import Literal

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from core import SchedulingPolicy, parse_cluster_spec
from core.cycle import Planner
from core.state import SchedulerState
from schemas.jobs import JobAdmitted, JobSpec, JobSubmitted
from schemas.nodes import GpuGeometryChanged, MigInstanceSpec

FRACTIONS = (0.1, 0.25, 0.3, 0.5)


def cluster(nodes: int) -> str:
    half = nodes // 2
    return (
        "groups:\n"
        f"  - {{count: {half}, gpus: 8, gpu_type: H100, mig: dynamic, reconfigure_s: 60}}\n"
        f"  - {{count: {nodes - half}, gpus: 8, gpu_type: H100}}\n"
    )


def specs(jobs: int, seed: int) -> list[JobSpec]:
    rng = random.Random(seed)
    out = []
    for _ in range(jobs):
        team = f"t{rng.randrange(8)}"
        if rng.random() < 0.5:
            fields: dict[str, object] = {"gpu_fraction": rng.choice(FRACTIONS)}
        else:
            fields = {"mig_profile": "1g.10gb"}
        out.append(JobSpec.model_validate({"name": "serve", "team": team, **fields}))
    return out


def run(nodes: int, jobs: int, seed: int, packing: Literal["fgd", "best-fit"]) -> None:
    policy = SchedulingPolicy(sharing_packing=packing)
    state = SchedulerState(policy)
    now = 0.0
    cut = [MigInstanceSpec(start=s, profile="1g.10gb") for s in range(7)]
    for node in parse_cluster_spec(cluster(nodes)):
        state.apply(node, now)
        if node.mig == "dynamic":
            for gpu in node.gpus:
                state.apply(
                    GpuGeometryChanged(
                        node_id=node.node_id,
                        gpu_index=gpu.index,
                        geometry=cut,
                        reconfigure_s=60,
                        reason="bench: cut up front",
                    ),
                    now,
                )
    for number, spec in enumerate(specs(jobs, seed)):
        job_id = f"j{number}"
        state.apply(JobSubmitted(job_id=job_id, spec=spec, submitted_by="bench"), now)
        state.apply(JobAdmitted(job_id=job_id, queue=spec.team, priority=spec.priority), now)
    planner = Planner()
    now = 61.0
    placed = 0
    wall = cpu = slowest = 0.0
    cycles = 0
    while True:
        began, cpu_began = time.perf_counter(), time.process_time()
        result = planner.schedule(state, now)
        spent = time.perf_counter() - began
        wall += spent
        cpu += time.process_time() - cpu_began
        slowest = max(slowest, spent)
        cycles += 1
        for event in result.decisions:
            state.apply(event, now)
        if not result.gangs_placed:
            break
        placed += result.gangs_placed
        now += 1.0
    ledger = state.sharing.ledger
    mix = [(ask, float(count)) for ask, count in ledger.held_mix.items()]
    fragmentation = ledger.fragmentation(mix, now)
    shared = sum(1 for node in ledger.nodes.values() for gpu in node.gpus if gpu.shares)
    print(
        f"  {packing:8s}: {placed:,}/{jobs:,} placed in {cycles} cycles; "
        f"{placed / wall:,.0f} placements/s ({placed / cpu:,.0f} per CPU s); "
        f"slowest cycle {slowest * 1000:,.0f} ms; {shared:,} GPUs soft-shared; "
        f"fragmentation {fragmentation:.1%}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--jobs", type=int, default=4000)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    print(
        f"live cycle: {args.nodes * 8:,} GPUs ({args.nodes // 2 * 8:,} cut 7 x 1g.10gb), "
        f"{args.jobs:,} slice and share jobs, seed {args.seed}"
    )
    for packing in ("best-fit", "fgd"):
        run(args.nodes, args.jobs, args.seed, packing)


if __name__ == "__main__":
    main()
