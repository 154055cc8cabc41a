"""Benchmark of the gating phase under one team's many dependencies (core/gating.py).

A team within its pending limit waits with 10,000 jobs of 64 dependencies each (on held jobs,
so that none can start); another team's job waits beside them. Prints the CPU of a cycle, the
median and the slowest of 20 after the first, with 64 dependencies per job and with 1.
Run `python bench/bench_gating.py`.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from core import Planner, SchedulerState, parse_cluster_spec
from schemas.jobs import Dependency, JobAdmitted, JobSpec, JobSubmitted
from services.runtime.collector import gc_paused

T0 = 1_700_000_000.0
JOBS = 10_000
CYCLES = 20


def cycle_cpu_ms(dependencies: int) -> list[float]:
    state = SchedulerState()
    for node in parse_cluster_spec("125x8:4:2"):
        state.apply(node, T0)

    def submit(job_id: str, team: str, depends_on: list[str], hold: bool = False) -> None:
        spec = JobSpec(
            name="x",
            team=team,
            command=["true"],
            hold=hold,
            depends_on=[Dependency(job=other) for other in depends_on],
        )
        state.apply(JobSubmitted(job_id=job_id, spec=spec, submitted_by="bench"), T0)
        state.apply(JobAdmitted(job_id=job_id, queue=team, priority="research"), T0)

    held = [f"held-{i}" for i in range(dependencies)]
    for job_id in held:
        submit(job_id, "many", [], hold=True)
    for i in range(JOBS):
        submit(f"dependent-{i}", "many", held)
    planner = Planner()
    times = []
    for k in range(CYCLES + 1):
        now = T0 + k
        # One job of another team each cycle: every cycle has something to decide.
        submit(f"other-{k}", "other", [])
        with gc_paused():
            started = time.process_time()
            result = planner.schedule(state, now)
            times.append((time.process_time() - started) * 1000)
        for decision in result.decisions:
            state.apply(decision, now)
    return times[1:]


def main() -> None:
    for dependencies in (64, 1):
        times = cycle_cpu_ms(dependencies)
        print(
            f"{JOBS:,} waiting jobs of {dependencies} dependencies each: cycle CPU "
            f"median {statistics.median(times):.0f} ms, slowest {max(times):.0f} ms"
        )


if __name__ == "__main__":
    main()
