"""What learned runtime estimates are worth to reservations and backfill, on a trace window.

The simulator's trace reader makes every job without an `estimated_runtime_s` column a perfect
user (its estimate is its true duration). Real users mostly give none; this runs the same
window, cluster and quotas three ways through the real core:

- `perfect`: every job estimated at its true duration (the trace reader's default; a bound);
- `none`: no job gives an estimate and nothing is learned (the policy's 4-hour default);
- `learned`: no job gives an estimate; runtimes are learned from the jobs that ended
  (core/estimates.py).

    python bench/bench_estimates.py --trace ../shared/traces/philly_sia_jobs.csv \
        --cluster 176x8:16 --quotas q176_strict.csv --start 2017-10-01 --end 2017-10-07
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

from core import SchedulingPolicy, parse_cluster_spec
from gangway.simulator.engine import Simulation
from gangway.simulator.quotas import read_quotas
from gangway.simulator.trace import TraceJob, parse_time, read_trace

MODES = ("perfect", "none", "learned")


def run(jobs: list[TraceJob], cluster: str, quotas_path: str | None, mode: str) -> dict[str, float]:
    nodes = parse_cluster_spec(cluster)
    quotas = read_quotas(quotas_path) if quotas_path else None
    if quotas is not None:
        jobs = [job for job in jobs if job.tenant in quotas]
    if mode != "perfect":
        jobs = [
            replace(job, spec=job.spec.model_copy(update={"estimated_runtime_s": None}))
            for job in jobs
        ]
    policy = SchedulingPolicy(learned_runtimes=mode == "learned")
    began = time.perf_counter()
    result = Simulation(jobs, nodes, policy=policy, quotas=quotas).run()
    wall_s = time.perf_counter() - began
    metrics = result.metrics(wall_s=wall_s)
    keys = (
        "jobs",
        "avg_queue_s",
        "p99_queue_s",
        "avg_queue_gt8_s",
        "gpu_utilization",
        "preemptions",
        "invariant_violations",
        "wall_s",
    )
    return {key: metrics[key] for key in keys if key in metrics}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", required=True)
    parser.add_argument("--cluster", required=True)
    parser.add_argument("--quotas")
    parser.add_argument("--start")
    parser.add_argument("--end")
    parser.add_argument("--modes", default=",".join(MODES))
    args = parser.parse_args(argv)
    nodes = parse_cluster_spec(args.cluster)
    jobs = read_trace(
        Path(args.trace),
        node_gpus=max(len(node.gpus) for node in nodes),
        start_s=parse_time(args.start) if args.start else None,
        end_s=parse_time(args.end, end_of_day=True) if args.end else None,
    )
    for mode in args.modes.split(","):
        figures = run(jobs, args.cluster, args.quotas, mode)
        print(json.dumps({"mode": mode, **figures}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
