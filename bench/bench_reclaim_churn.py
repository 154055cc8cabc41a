"""Gangs placed and then evicted at once for a reclaim the scheduler already knew of.

A gang bound while a job of another queue, within its guarantee, was already waiting, and
evicted for that job's reclaim within the preemption grace of its binding: its GPUs were
started and stopped for nothing. Counted on a Philly window through the simulator (the real
core), with the Helios guarantees scaled to the cluster and borrowing allowed:

    python bench/bench_reclaim_churn.py --cluster 44x8:16 --scale 0.125 \
        --start 2017-10-01 --end 2017-10-07

"At the next cycle": evicted at the first moment after its binding at which the core decided
anything (the simulator runs one cycle per moment with news). The preemptor must have been
waiting since a moment before the binding: one requeued at that very moment is not counted.
"""

from __future__ import annotations

import argparse
import sys
import time
from bisect import bisect_right
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from core import SchedulingPolicy, parse_cluster_spec
from gangway.simulator.engine import Simulation
from gangway.simulator.quotas import quotas_from_node_counts
from gangway.simulator.trace import parse_time, read_trace
from schemas.base import Event
from schemas.jobs import (
    GangReserved,
    JobAdmitted,
    JobDeferred,
    JobRequeued,
    PreemptionRequested,
    ReservationPlanned,
)

TRACES = Path(__file__).resolve().parent.parent.parent / "shared" / "traces"
# The core's decisions: a moment with one of them is a moment a cycle ran.
_DECISIONS = (GangReserved, PreemptionRequested, JobDeferred, ReservationPlanned, JobRequeued)


def count(log: list[tuple[float, Event]], grace_s: float) -> tuple[int, int, int]:
    """(reclaim evictions, those of gangs bound while the preemptor waited and evicted within
    the grace, those evicted at the next cycle)."""
    moments = sorted({at for at, event in log if isinstance(event, _DECISIONS)})
    bound: dict[str, float] = {}
    waiting_since: dict[str, float] = {}
    reclaims = within_grace = next_cycle = 0
    for at, event in log:
        if isinstance(event, JobAdmitted | JobRequeued):
            waiting_since[event.job_id] = at
        elif isinstance(event, GangReserved):
            bound[event.job_id] = at
            waiting_since.pop(event.job_id, None)
        elif isinstance(event, PreemptionRequested) and event.code == "reclaim":
            reclaims += 1
            placed = bound[event.job_id]
            since = waiting_since.get(str(event.preemptor_job_id))
            if since is None or since >= placed or at - placed > grace_s:
                continue
            within_grace += 1
            following = bisect_right(moments, placed)
            if following < len(moments) and moments[following] == at:
                next_cycle += 1
    return reclaims, within_grace, next_cycle


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--trace", default=str(TRACES / "philly_sia_jobs.csv"))
    parser.add_argument("--nodes", default=str(TRACES / "philly_vc_nodes_helios.csv"))
    parser.add_argument("--cluster", default="44x8:16")
    parser.add_argument("--scale", type=float, default=0.125, help="of the Helios guarantees")
    parser.add_argument("--start", default="2017-10-01")
    parser.add_argument("--end", default="2017-10-07")
    args = parser.parse_args()
    if not Path(args.trace).is_file():
        print(f"bench_reclaim_churn: no trace at {args.trace}; skipped", file=sys.stderr)
        return 0
    quotas = quotas_from_node_counts(args.nodes, scale=args.scale)
    jobs = [
        job
        for job in read_trace(
            args.trace,
            start_s=parse_time(args.start),
            end_s=parse_time(args.end, end_of_day=True),
        )
        if job.tenant in quotas
    ]
    policy = SchedulingPolicy()
    simulation = Simulation(
        jobs, parse_cluster_spec(args.cluster), policy=policy, quotas=quotas, keep_log=True
    )
    began = time.perf_counter()
    result = simulation.run()
    wall = time.perf_counter() - began
    assert simulation.log is not None
    reclaims, within_grace, next_cycle = count(simulation.log, policy.preemption_grace_s)
    metrics = result.metrics(wall)
    print(
        f"{len(jobs):,} jobs, {args.start} to {args.end}, {args.cluster}, guarantees x "
        f"{args.scale}: {result.preemptions:,} preemptions, {reclaims:,} for reclaims; gangs "
        f"bound while their reclaimer waited and evicted within {policy.preemption_grace_s:g} s: "
        f"{within_grace:,}, at the next cycle: {next_cycle:,}; avg queue "
        f"{metrics['avg_queue_s']:,.0f} s, avg JCT {metrics['avg_jct_s']:,.0f} s; "
        f"{len(result.violations)} invariant violations; {wall:.0f} s"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
