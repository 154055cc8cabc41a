"""Benchmark of the scheduling core (DESIGN §6): cycle time, placements/s, memory, replay speed.

12,500 nodes x 8 GPUs (racks of 16 nodes, blocks of 8 racks) filled to a busy cluster, then
10,000 pending jobs of a realistic mix (mostly 1-8 GPUs, some gangs of 64 to 4,096 GPUs), with
churn (gangs ending) between cycles. Prints its figures; run `python bench/bench_core.py`.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import random
import resource
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from core import (
    Planner,
    SchedulerState,
    SchedulingPolicy,
    parse_cluster_spec,
)
from schemas.base import Event
from schemas.jobs import (
    GANG_RELEASING_EVENTS,
    GangReserved,
    JobAdmitted,
    JobSpec,
    JobSubmitted,
    JobSucceeded,
    RankPlacement,
    TaskExited,
    TaskStarted,
    TopologySpec,
)
from services.runtime.collector import gc_paused

T0 = 1_700_000_000.0
TEAMS = [f"team-{i:02d}" for i in range(20)]
PRIORITIES = ["research"] * 6 + ["production"] * 2 + ["best-effort"] * 2


def job_mix(rng: random.Random, job_id: str) -> JobSubmitted:
    roll = rng.random()
    topology = TopologySpec()
    if roll < 0.80:
        tasks, per_task = 1, rng.choice([1, 1, 1, 2, 2, 4, 8])
    elif roll < 0.95:
        tasks, per_task = rng.choice([2, 4, 8]), 8
        topology = TopologySpec(tp_size=8)
    else:
        tasks, per_task = rng.choice([8, 16, 32, 64, 128, 256, 512]), 8
        topology = TopologySpec(tp_size=8)
    spec = JobSpec(
        name=job_id,
        team=rng.choice(TEAMS),
        priority=rng.choice(PRIORITIES),
        tasks=tasks,
        gpus_per_task=per_task,
        topology=topology,
        estimated_runtime_s=rng.choice([600.0, 3600.0, 4 * 3600.0, 24 * 3600.0]),
    )
    return JobSubmitted(job_id=job_id, spec=spec, submitted_by="bench")


class Bench:
    def __init__(self, spec: str) -> None:
        self.state = SchedulerState(SchedulingPolicy())
        self.planner = Planner()
        self.log: list[tuple[Event, float]] = []
        self.now = T0
        self.rng = random.Random(42)
        self.jobs = 0
        # CPU seconds per cycle: on a shared machine wall time also counts other processes.
        self.cpu_times: list[float] = []
        # The ranks each gang started, (attempt, [(rank, node)]): a released gang's ranks are
        # stopped and their exits recorded, as node agents do (their GPUs wait for that).
        self.live_ranks: dict[str, tuple[int, list[tuple[int, str]]]] = {}
        # One digest of each cycle's decisions, in order (--decisions): the proof that a
        # change to the core decided exactly as before.
        self.digests: list[str] = []
        # Waiting jobs the last cycle left for the next, past its bound on newly queued jobs.
        self.not_considered = 0
        for node in parse_cluster_spec(spec):
            self.record(node)

    def record(self, event: Event) -> None:
        self.log.append((event, self.now))
        self.state.apply(event, self.now)

    def submit(self, count: int) -> None:
        for _ in range(count):
            self.jobs += 1
            submitted = job_mix(self.rng, f"j{self.jobs:07d}")
            self.record(submitted)
            self.record(
                JobAdmitted(
                    job_id=submitted.job_id,
                    queue=submitted.spec.team,
                    priority=submitted.spec.priority,
                )
            )

    def cycle(self) -> tuple[float, int, int]:
        # As the scheduler service runs it: the collector paused around the cycle. Both clocks
        # stop inside the pause: the collection that the collector, enabled again, starts at
        # the next allocation scans the whole heap (here mostly the bench's own event log) and
        # is timed apart (`CollectorPasses`), not charged to whichever cycle it follows.
        with gc_paused():
            started = time.perf_counter()
            cpu_started = time.process_time()
            result = self.planner.schedule(self.state, self.now)
            elapsed = time.perf_counter() - started
            self.cpu_times.append(time.process_time() - cpu_started)
        digest = hashlib.sha256()
        for decision in result.decisions:
            digest.update(type(decision).__name__.encode())
            digest.update(decision.model_dump_json().encode())
        self.digests.append(f"{len(result.decisions)} {result.tasks_placed} {digest.hexdigest()}")
        self.not_considered = result.not_considered
        for decision in result.decisions:
            self.record(decision)
            if isinstance(decision, GANG_RELEASING_EVENTS):
                self.stop_ranks(decision.job_id)
            if isinstance(decision, GangReserved):
                self.live_ranks[decision.job_id] = (
                    decision.attempt,
                    [(rank.rank, rank.node_id) for rank in decision.ranks],
                )
                for rank in decision.ranks:
                    self.record(
                        TaskStarted(
                            job_id=decision.job_id,
                            attempt=decision.attempt,
                            rank=rank.rank,
                            node_id=rank.node_id,
                        )
                    )
        return elapsed, result.tasks_placed, len(result.decisions)

    def stop_ranks(self, job_id: str) -> None:
        live = self.live_ranks.pop(job_id, None)
        if live is None:
            return
        attempt, ranks = live
        for rank, node_id in ranks:
            self.record(
                TaskExited(
                    job_id=job_id,
                    attempt=attempt,
                    rank=rank,
                    node_id=node_id,
                    exit_code=-9,
                    reason="stopped",
                )
            )

    def finish_some(self, fraction: float) -> None:
        running = [v for v in self.state.jobs() if v.state == "running"]
        for view in self.rng.sample(running, int(len(running) * fraction)):
            gang = view.placement
            rank = 0
            for node_id, gpus in gang.items():
                for _ in range(0, len(gpus), max(1, view.gpus_per_task)):
                    self.record(
                        TaskExited(
                            job_id=view.job_id,
                            attempt=view.attempt,
                            rank=rank,
                            node_id=node_id,
                            exit_code=0,
                        )
                    )
                    rank += 1
            self.live_ranks.pop(view.job_id, None)  # exited on their own


class CollectorPasses:
    """The CPU of the cyclic collector's passes of the oldest generation while it is watched.

    Between busy cycles such a pass scans the whole heap (~0.5 s with this bench's log held):
    before 2026-11-23 it fell inside the next cycle's clock, the slowest "cycle" of a run.
    """

    def __init__(self) -> None:
        self.full: list[float] = []
        self._started = 0.0
        gc.callbacks.append(self._observe)

    def _observe(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.process_time()
        elif info["generation"] == 2:
            self.full.append(time.process_time() - self._started)

    def close(self) -> None:
        gc.callbacks.remove(self._observe)


# The phases of a cycle as core/cycle.py calls them, timed (CPU) when asked with --phases.
PHASES = (
    "react",
    "order",
    "place",
    "preempt",
    "refill_headroom",
    "preempt_for_fairness",
    "explain",
)


def time_phases() -> dict[str, list[float]]:
    """Wrap the phase functions core/cycle.py calls so that each cycle's CPU per phase is
    recorded (one list per phase, one entry per cycle that ran it; the caller clears them)."""
    import core.cycle

    spent: dict[str, list[float]] = {name: [] for name in PHASES}

    def timed(name: str, phase: Callable[..., object]) -> Callable[..., object]:
        def run(*args: object, **kwargs: object) -> object:
            started = time.process_time()
            try:
                return phase(*args, **kwargs)
            finally:
                spent[name].append(time.process_time() - started)

        return run

    for name in PHASES:
        setattr(core.cycle, name, timed(name, getattr(core.cycle, name)))
    return spent


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cluster", default="12500x8:16:8")
    parser.add_argument("--pending", type=int, default=10_000)
    parser.add_argument("--cycles", type=int, default=30)
    parser.add_argument("--replay-events", type=int, default=1_000_000)
    parser.add_argument(
        "--phases", action="store_true", help="also print each phase's CPU in the busy cycles"
    )
    parser.add_argument(
        "--decisions",
        type=Path,
        help="write one line per cycle of the peak, fill, busy and settling cycles (decisions, "
        "tasks placed, SHA-256 of the decision events): two runs decided alike if the files match",
    )
    args = parser.parse_args()
    phases = time_phases() if args.phases else None

    bench = Bench(args.cluster)
    print(f"cluster: {bench.state.total_gpus} GPUs on {len(list(bench.state.nodes()))} nodes")

    # Peak placement: an idle cluster receives 20,000 jobs of 1-8 GPUs and 2-8 task gangs.
    burst = Bench(args.cluster)
    for number in range(20_000):
        job_id = f"b{number:06d}"
        tasks = 1 if number % 5 else 1 + number % 8
        spec = JobSpec(
            name=job_id,
            team=TEAMS[number % len(TEAMS)],
            tasks=tasks,
            gpus_per_task=[1, 2, 4, 8][number % 4] if tasks == 1 else 1,
        )
        burst.record(JobSubmitted(job_id=job_id, spec=spec, submitted_by="bench"))
        burst.record(JobAdmitted(job_id=job_id, queue=spec.team, priority="research"))
    # The policy's bound on newly queued jobs a cycle considers spreads the burst over
    # ceil(20,000 / bound) cycles, run one after the other as the service does: placements/s
    # is over all of them.
    wall, tasks, _ = burst.cycle()
    first_wall, first_tasks = wall, tasks
    while burst.not_considered:
        more_wall, more_tasks, _ = burst.cycle()
        wall += more_wall
        tasks += more_tasks
    burst_cpu = sum(burst.cpu_times)
    bench.digests[:0] = burst.digests
    cycles = len(burst.cpu_times)
    spread = (
        f"{cycles} cycles (at most {burst.state.policy.max_new_jobs_per_cycle:,} newly queued "
        f"jobs considered a cycle; the first placed {first_tasks:,} tasks in "
        f"{first_wall * 1000:.0f} ms) of {wall * 1000:.0f} ms in all"
        if cycles > 1
        else f"one cycle of {wall * 1000:.0f} ms"
    )
    print(
        f"peak placement: {tasks:,} tasks in {spread} ({burst_cpu * 1000:.0f} ms CPU) = "
        f"{tasks / wall:,.0f} task placements/s ({tasks / burst_cpu:,.0f} per CPU s)"
    )
    del burst

    # Fill: many jobs placed at once measures raw placement throughput.
    fill_seconds = 0.0
    fill_tasks = 0
    bench.cpu_times.clear()
    while bench.state.allocated_gpus < 0.9 * bench.state.total_gpus:
        bench.submit(1_000)
        elapsed, tasks, _ = bench.cycle()
        fill_seconds += elapsed
        fill_tasks += tasks
        bench.now += 1
    fill_cpu = sum(bench.cpu_times)
    print(
        f"fill: {fill_tasks} tasks placed in {fill_seconds:.2f} s of cycles ({fill_cpu:.2f} s "
        f"CPU) = {fill_tasks / fill_seconds:,.0f} task placements/s; "
        f"allocated {bench.state.allocated_gpus}/{bench.state.total_gpus} GPUs"
    )

    # Busy steady state: top the queue up to the pending target, churn between cycles.
    bench.submit(max(0, args.pending - bench.state.pending))
    times: list[float] = []
    bench.cpu_times.clear()
    for spent in (phases or {}).values():
        spent.clear()
    placed = 0
    collector = CollectorPasses()
    for _ in range(args.cycles):
        bench.finish_some(0.01)
        bench.now += 30
        elapsed, tasks, _ = bench.cycle()
        times.append(elapsed)
        placed += tasks
        bench.submit(max(0, args.pending - bench.state.pending))
    collector.close()
    cpu = bench.cpu_times
    print(
        f"busy cycles ({args.cycles}, ~{args.pending} pending): wall p50 "
        f"{statistics.median(times) * 1000:.0f} ms, p99 {percentile(times, 0.99) * 1000:.0f} ms, "
        f"max {max(times) * 1000:.0f} ms; CPU p50 {statistics.median(cpu) * 1000:.0f} ms, "
        f"p99 {percentile(cpu, 0.99) * 1000:.0f} ms; {placed} tasks placed"
    )
    if phases is not None:
        print(
            "busy cycles' CPU by phase, p50 / max (ms): "
            + ", ".join(
                f"{name} {statistics.median(spent) * 1000:.1f} / {max(spent) * 1000:.1f}"
                for name, spent in phases.items()
                if spent
            )
        )
    print(
        f"collector between busy cycles: {len(collector.full)} full passes, CPU max "
        f"{max(collector.full, default=0.0) * 1000:.0f} ms (not in the cycles' figures)"
    )
    # Settle: record decisions until a cycle has nothing to add (preemptors take their victims
    # a few per cycle, so this takes a while), then time cycles with nothing new to do.
    settling = 0
    while settling < 1_000 and bench.cycle()[2]:
        settling += 1
        bench.now += 1
    quiet = time.perf_counter()
    for _ in range(100):
        with gc_paused():
            bench.planner.schedule(bench.state, bench.now)
    if args.decisions is not None:
        args.decisions.write_text("".join(f"{line}\n" for line in bench.digests))
    print(
        f"quiet cycle (nothing changed, settled after {settling} cycles): "
        f"{(time.perf_counter() - quiet) * 10:.3f} ms"
    )
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(
        f"memory: peak RSS {peak_kib / 1024:.0f} MiB (the whole process, including the "
        f"bench's own event log of {len(bench.log):,} events)"
    )

    # Replay: fold a log of the requested size into a fresh state; past the bench's own log,
    # whole job lives (submit, admit, gang, start, exit, success) of 1-GPU jobs across the nodes.
    log = bench.log
    node_ids = [view.node_id for view in bench.state.nodes()]
    extra = 0
    while len(log) < args.replay_events:
        extra += 1
        job_id = f"r{extra:07d}"
        node_id = node_ids[extra % len(node_ids)]
        spec = JobSpec(name=job_id, team="replay", gpus_per_task=1)
        at = bench.now + extra
        log += [
            (JobSubmitted(job_id=job_id, spec=spec, submitted_by="bench"), at),
            (JobAdmitted(job_id=job_id, queue="replay", priority="research"), at),
            (
                GangReserved(
                    job_id=job_id,
                    attempt=1,
                    ranks=[RankPlacement(rank=0, node_id=node_id, gpus=[7])],
                ),
                at,
            ),
            (TaskStarted(job_id=job_id, attempt=1, rank=0, node_id=node_id), at),
            (TaskExited(job_id=job_id, attempt=1, rank=0, node_id=node_id, exit_code=0), at),
            (JobSucceeded(job_id=job_id, attempt=1), at),
        ]
    # A service reads its log in pages; this bench holds all of it, which the cyclic collector
    # would rescan over and over: freeze it, as it is no part of what is measured.
    gc.collect()
    gc.freeze()
    replay = SchedulerState(SchedulingPolicy())
    started = time.perf_counter()
    cpu_started = time.process_time()
    for event, at in log[: args.replay_events]:
        replay.apply(event, at)
    elapsed = time.perf_counter() - started
    cpu_replay = time.process_time() - cpu_started
    print(
        f"replay: {args.replay_events:,} events in {elapsed:.2f} s ({cpu_replay:.2f} s CPU) = "
        f"{args.replay_events / elapsed:,.0f} events/s"
    )


if __name__ == "__main__":
    main()
