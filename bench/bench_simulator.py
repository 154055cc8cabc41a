"""Simulator speed: seconds per 1,000 jobs of the Philly window, on a small and a huge cluster.

The same trace replayed at 176 nodes (queues form) and at 12,500 nodes (100,000 GPUs, nothing
waits) shows whether the time per job grows with the cluster. Run: `python bench/bench_simulator.py`
(`--jobs N` replays only the window's first N jobs).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from core import SchedulingPolicy, parse_cluster_spec
from gangway.simulator.engine import Simulation
from gangway.simulator.trace import parse_time, read_trace

TRACE = Path(__file__).resolve().parent.parent.parent / "shared" / "traces" / "philly_sia_jobs.csv"
CLUSTERS = ("176x8:16", "12500x8:16")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--trace", default=str(TRACE))
    parser.add_argument("--start", default="2017-10-01")
    parser.add_argument("--end", default="2017-11-30")
    parser.add_argument("--jobs", type=int, default=None, help="only the first N jobs")
    parser.add_argument("--policy", choices=("gangway", "fifo"), default="gangway")
    parser.add_argument("--clusters", nargs="+", default=list(CLUSTERS))
    args = parser.parse_args()
    if not Path(args.trace).is_file():
        print(f"bench_simulator: no trace at {args.trace}; skipped", file=sys.stderr)
        return 0
    jobs = read_trace(
        args.trace,
        start_s=parse_time(args.start),
        end_s=parse_time(args.end, end_of_day=True),
    )
    if args.jobs is not None:
        jobs = jobs[: args.jobs]
    print(f"simulator: {len(jobs):,} jobs, {args.start} to {args.end}, policy {args.policy}")
    for cluster in args.clusters:
        nodes = parse_cluster_spec(cluster)
        began = time.perf_counter()
        simulation = Simulation(jobs, nodes, policy=SchedulingPolicy(name=args.policy))
        result = simulation.run()
        wall = time.perf_counter() - began
        completed = sum(1 for record in result.records if record.outcome == "succeeded")
        gpus = sum(len(node.gpus) for node in nodes)
        print(
            f"  {cluster:>12} ({gpus:>7,} GPUs): {wall:8.1f} s wall, "
            f"{wall / len(jobs) * 1000:6.2f} s per 1,000 jobs, {result.cycles:,} cycles, "
            f"{result.events:,} events, {completed:,} completed, "
            f"{len(result.violations)} invariant violations"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
