"""SLO classes: the admit latency of inference-critical replicas on a cluster full of
preemptible training, in the simulator (simulated seconds from submission to the gang's
binding), with the policy's headroom and without it.

Training gangs of 8 GPUs, a day long, fill every node but the headroom; every 30 minutes a
burst of 1-GPU replicas of 20 minutes arrives, 0.1 s apart. With headroom, the replicas land
in it at once and the training they displace is evicted after, with its checkpoint grace;
without, they preempt training and wait for its checkpoint (120 s grace).

Run: `python bench/bench_slo.py [--nodes 128] [--bursts 10] [--replicas 64] [--slices]`
(`--slices`: the replicas are 1g.10gb MIG slices, on fixed-MIG nodes full of best-effort
slices, and the headroom is counted in sevenths of a GPU).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from core import SchedulingPolicy, parse_cluster_spec
from gangway.simulator.engine import Simulation
from gangway.simulator.metrics import percentile
from gangway.simulator.trace import read_trace

HEADER = "job_id,submit_time,num_gpus,duration_s,tenant,priority"


def write_trace(path: Path, nodes: int, headroom_nodes: int, bursts: int, replicas: int) -> Path:
    rows = [f"train{n},0,8,86400,research,research" for n in range(nodes - headroom_nodes)]
    rows += [f"more{n},10,8,86400,research,research" for n in range(headroom_nodes)]
    for burst in range(bursts):
        start = 600 + burst * 1800
        rows += [
            f"infer{burst}-{r},{start + r / 10},1,1200,serve,inference-critical"
            for r in range(replicas)
        ]
    path.write_text("\n".join((HEADER, *rows)) + "\n")
    return path


SLICE_HEADER = "job_id,submit_time,num_gpus,duration_s,tenant,priority,mig_profile"


def write_slice_trace(path: Path, nodes: int, mig_nodes: int, bursts: int, replicas: int) -> Path:
    """Training on the plain nodes; best-effort 1g.10gb slices on every instance of the MIG
    nodes (seven per GPU); bursts of 1g.10gb inference-critical replicas."""
    rows = [f"train{n},0,8,86400,research,research," for n in range(nodes)]
    rows += [
        f"fill{n},{1 + n / 1000},1,86400,batch,best-effort,1g.10gb"
        for n in range(mig_nodes * 8 * 7)
    ]
    for burst in range(bursts):
        start = 600 + burst * 1800
        rows += [
            f"infer{burst}-{r},{start + r / 10},1,1200,serve,inference-critical,1g.10gb"
            for r in range(replicas)
        ]
    path.write_text("\n".join((SLICE_HEADER, *rows)) + "\n")
    return path


def slices(nodes: int, bursts: int, replicas: int) -> None:
    """The same, for inference replicas of a seventh of a GPU: the headroom is counted in exact
    fractions, so one kept GPU serves seven replicas, and its refill evicts one best-effort
    slice per replica; without headroom each replica preempts a slice and waits for it."""
    mig_nodes = max(1, nodes // 16)
    headroom = -(-replicas // 7)
    seven = ", ".join(["1g.10gb"] * 7)
    cluster = (
        "groups:\n"
        f"  - {{count: {nodes}, gpus: 8, gpu_type: H100}}\n"
        f"  - {{count: {mig_nodes}, gpus: 8, gpu_type: H100, mig: [{seven}]}}\n"
    )
    with tempfile.TemporaryDirectory() as scratch:
        trace = write_slice_trace(Path(scratch) / "slices.csv", nodes, mig_nodes, bursts, replicas)
        print(
            f"inference-critical slices: {nodes * 8} GPUs of training, {mig_nodes * 8} MIG GPUs "
            f"full of best-effort 1g.10gb slices, {bursts} bursts of {replicas} 1g.10gb replicas"
        )
        for label, policy in (
            (f"headroom {headroom} GPUs", SchedulingPolicy(inference_headroom_gpus=headroom)),
            ("no headroom", SchedulingPolicy()),
        ):
            figures = run(trace, cluster, policy)
            print(
                f"  {label:>18}: p50 {figures['p50_s']:.2f} s, p99 {figures['p99_s']:.2f} s, "
                f"max {figures['max_s']:.2f} s over {figures['replicas']:.0f} replicas; "
                f"{figures['preemptions']:.0f} preemptions, {figures['violations']:.0f} "
                f"violations; {figures['wall_s']:.1f} s wall"
            )


def run(trace: Path, cluster: str, policy: SchedulingPolicy) -> dict[str, float]:
    simulation = Simulation(read_trace(trace), parse_cluster_spec(cluster), policy=policy)
    began = time.perf_counter()
    result = simulation.run()
    wall = time.perf_counter() - began
    waits = sorted(
        r.queue_s for r in result.records if r.job_id.startswith("infer") and r.queue_s is not None
    )
    return {
        "replicas": len(waits),
        "p50_s": percentile(waits, 50),
        "p99_s": percentile(waits, 99),
        "max_s": waits[-1] if waits else 0.0,
        "preemptions": result.preemptions,
        "violations": len(result.violations),
        "wall_s": wall,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=128)
    parser.add_argument("--bursts", type=int, default=10)
    parser.add_argument("--replicas", type=int, default=64)
    parser.add_argument(
        "--slices", action="store_true", help="replicas of a 1g.10gb slice, not whole GPUs"
    )
    args = parser.parse_args()
    if args.slices:
        slices(args.nodes, args.bursts, args.replicas)
        return
    headroom = args.replicas
    with tempfile.TemporaryDirectory() as scratch:
        trace = write_trace(
            Path(scratch) / "trace.csv", args.nodes, -(-headroom // 8), args.bursts, args.replicas
        )
        cluster = f"{args.nodes}x8:16:4"
        print(
            f"inference-critical admit latency: {args.nodes * 8} GPUs full of training, "
            f"{args.bursts} bursts of {args.replicas} 1-GPU replicas (simulated seconds)"
        )
        for label, policy in (
            (f"headroom {headroom} GPUs", SchedulingPolicy(inference_headroom_gpus=headroom)),
            ("no headroom", SchedulingPolicy()),
        ):
            figures = run(trace, cluster, policy)
            print(
                f"  {label:>18}: p50 {figures['p50_s']:.2f} s, p99 {figures['p99_s']:.2f} s, "
                f"max {figures['max_s']:.2f} s over {figures['replicas']:.0f} replicas; "
                f"{figures['preemptions']:.0f} preemptions, {figures['violations']:.0f} "
                f"violations; {figures['wall_s']:.1f} s wall"
            )


if __name__ == "__main__":
    main()
