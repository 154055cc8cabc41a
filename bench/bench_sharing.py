"""GPU sharing: allocation at 100% arrived demand (FGD packing against best-fit) on a generated
GPU-sharing trace, and the sharing ledger's placement throughput with 50% fractional tasks.

The trace is drawn with a fixed seed, in the spirit of Alibaba's GPU-sharing trace the FGD
paper uses: about half the tasks ask a share of one GPU (0.1 to 0.7), a sixth a MIG slice,
a quarter 1 to 8 whole GPUs, the rest CPUs only; eight teams. The cluster is half `mig:
dynamic` H100 nodes, half plain ones. Both policies see the same trace and the same cluster.

Run: `python bench/bench_sharing.py [--nodes 64] [--throughput-nodes 12500]`.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from core.mig import H100_80GB, pack
from core.sharing import Packing, RecentMix, SharingLedger, TaskAsk
from core.topology import parse_cluster_spec
from gangway.simulator.fill import run_fill
from gangway.simulator.trace import read_trace

PROFILES = (("1g.10gb", 0.5), ("2g.20gb", 0.25), ("3g.40gb", 0.15), ("7g.80gb", 0.10))
FRACTIONS = (0.1, 0.2, 0.25, 0.3, 0.5, 0.7)


def write_trace(path: Path, jobs: int, seed: int) -> Path:
    rng = random.Random(seed)
    rows = ["job_id,submit_time,num_gpus,duration_s,tenant,gpu_fraction,mig_profile,cpus,memory_mb"]
    for number in range(jobs):
        team = f"t{rng.randrange(8)}"
        cpus = rng.choice((1, 2, 4, 8))
        memory = rng.choice((4096, 8192, 16384))
        draw = rng.random()
        if draw < 0.5:
            fraction = rng.choice(FRACTIONS)
            row = f"{number},{number},1,3600,{team},{fraction},,{cpus},{memory}"
        elif draw < 0.67:
            profile = rng.choices([p for p, _ in PROFILES], [w for _, w in PROFILES])[0]
            row = f"{number},{number},1,3600,{team},,{profile},{cpus},{memory}"
        elif draw < 0.92:
            gpus = rng.choice((1, 1, 2, 4, 8))
            row = f"{number},{number},{gpus},3600,{team},,,{cpus * gpus},{memory * gpus}"
        else:
            row = f"{number},{number},0,3600,{team},,,{cpus},{memory}"
        rows.append(row)
    path.write_text("\n".join(rows) + "\n")
    return path


def cluster(nodes: int) -> str:
    half = nodes // 2
    return (
        "groups:\n"
        f"  - {{count: {half}, gpus: 8, gpu_type: H100, mig: dynamic, reconfigure_s: 60,"
        " cpus: 128, memory_mb: 1048576}\n"
        f"  - {{count: {nodes - half}, gpus: 8, gpu_type: H100, cpus: 128,"
        " memory_mb: 1048576}\n"
    )


def allocation(nodes: int, seed: int) -> None:
    trace = write_trace(Path(f"/tmp/gangway-sharing-{seed}.csv"), nodes * 8 * 3, seed)
    jobs = read_trace(trace)
    spec = parse_cluster_spec(cluster(nodes))
    print(f"allocation at 100% arrived demand: {nodes} nodes x 8 H100, seed {seed}")
    packings: tuple[Packing, ...] = ("fgd", "best-fit")
    for packing in packings:
        began = time.perf_counter()
        result = run_fill(jobs, spec, packing=packing)
        wall = time.perf_counter() - began
        at_full = result.allocated_share_at_full_demand
        frag = [p["fragmentation"] for p in result.fragmentation]
        print(
            f"  {packing:8s}: allocated {at_full:.1%} at 100% demand, "
            f"{result.placed_jobs}/{result.jobs} jobs placed, "
            f"fragmentation mean {sum(frag) / len(frag):.1%} max {max(frag):.1%}, "
            f"{result.geometry_changes} re-partitions, {wall:.1f} s"
        )


def sliced_ledger(nodes: int, indexed: bool) -> SharingLedger:
    """The cluster, its dynamic half cut into 7 x 1g.10gb per GPU up front (placement is
    measured here, not re-geometry)."""
    ledger = SharingLedger(indexed=indexed)
    for node in parse_cluster_spec(cluster(nodes)):
        ledger.register(node)
    geometry = pack(H100_80GB, ["1g.10gb"] * 7) or ()
    for book_node in ledger.nodes.values():
        if book_node.mig == "dynamic":
            for gpu in book_node.gpus:
                gpu.geometry = geometry
            ledger.changed(book_node.node_id)
    return ledger


def throughput(nodes: int, tasks: int, seed: int, indexed: bool = True) -> list[object]:
    rng = random.Random(seed)
    asks = []
    for _ in range(tasks):
        team = f"t{rng.randrange(8)}"
        draw = rng.random()
        if draw < 0.35:
            asks.append(TaskAsk(team, thousandths=rng.choice((100, 250, 500))))
        elif draw < 0.5:
            asks.append(TaskAsk(team, mig_profile="1g.10gb"))
        else:
            asks.append(TaskAsk(team, whole_gpus=rng.choice((1, 2, 4, 8))))
    index = "with the free-capacity index" if indexed else "without an index"
    print(
        f"placement throughput: {nodes * 8:,} GPUs, {tasks} tasks (50% fractional or slices), "
        f"{index}"
    )
    packings: tuple[Packing, ...] = ("best-fit", "fgd")
    spots: list[object] = []
    for packing in packings:
        book = sliced_ledger(nodes, indexed)
        mix = RecentMix()
        began = time.perf_counter()
        cpu_began = time.process_time()
        placed = 0
        for number, ask in enumerate(asks):
            mix.note(ask)
            spot = book.place(ask, 0.0, mix.weights(), packing=packing)
            spots.append(spot)
            if spot is not None:
                book.bind(f"x{number}", ask, spot)
                placed += 1
        wall = time.perf_counter() - began
        cpu = time.process_time() - cpu_began
        print(
            f"  {packing:8s}: {tasks / wall:,.1f} placements/s ({placed} placed, {wall:.2f} s; "
            f"{tasks / cpu:,.1f} per CPU second)"
        )
    return spots


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=64)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--throughput-nodes", type=int, default=12_500)
    parser.add_argument("--throughput-tasks", type=int, default=5_000)
    # The ledger without its index scans every GPU per placement: a few tasks are enough.
    parser.add_argument("--unindexed-tasks", type=int, default=10)
    parser.add_argument("--skip-allocation", action="store_true")
    args = parser.parse_args()
    if not args.skip_allocation:
        allocation(args.nodes, args.seed)
    indexed = throughput(args.throughput_nodes, args.throughput_tasks, args.seed)
    if args.unindexed_tasks:
        plain = throughput(args.throughput_nodes, args.unindexed_tasks, args.seed, indexed=False)
        # The same tasks from the same seed: the first ones must land on the same spots.
        count = args.unindexed_tasks
        same = (
            plain[:count] == indexed[:count]
            and plain[count:] == indexed[args.throughput_tasks : args.throughput_tasks + count]
        )
        print(f"  the same spots with and without the index: {same}")


if __name__ == "__main__":
    main()
