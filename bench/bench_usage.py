"""What one GET /v1/usage costs: the usage report of one team, and of every team, over the
default window (30 days, by day), on a book of TEAMS teams with JOBS jobs each (one allocated
and one used interval per job, spread over 60 days). Prints the figures; run
`python bench/bench_usage.py [--teams N --jobs N]`.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from uuid import uuid4

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from schemas.base import Event
from schemas.envelope import EventEnvelope
from schemas.jobs import (
    GangReserved,
    JobAdmitted,
    JobSpec,
    JobSubmitted,
    JobSucceeded,
    RankPlacement,
    TaskStarted,
)
from schemas.nodes import GpuInfo, NodeRegistered
from services.api.projections.model import ReadModels
from services.api.projections.usage import report

START = datetime(2026, 9, 1, tzinfo=UTC)


def build(teams: int, jobs: int) -> ReadModels:
    models = ReadModels()
    versions: dict[str, int] = {}
    position = 0

    def apply(at: datetime, *events: Event) -> None:
        nonlocal position
        for event in events:
            position += 1
            version = versions[event.stream] = versions.get(event.stream, 0) + 1
            models.apply(
                EventEnvelope(
                    event_id=uuid4(),
                    stream=event.stream,
                    version=version,
                    position=position,
                    type=event.type,
                    schema_version=event.schema_version,
                    payload=event,
                    recorded_at=at,
                    producer="bench",
                )
            )

    gpus = [GpuInfo(index=i, uuid=f"n1-{i}", model="H100", memory_mb=81920) for i in range(8)]
    node = NodeRegistered(
        node_id="n1",
        hostname="n1",
        gpu_type="H100",
        gpus=gpus,
        rack="r1",
        block="b1",
        discovered_by="spec",
    )
    apply(START, node)
    step = timedelta(days=60) / (teams * jobs)
    at = START
    for index in range(jobs):
        for t in range(teams):
            job_id, team = f"j{t}-{index}", f"team{t}"
            spec = JobSpec(name="b", team=team, tasks=1, gpus_per_task=8)
            placement = RankPlacement(rank=0, node_id="n1", gpus=list(range(8)))
            apply(
                at,
                JobSubmitted(job_id=job_id, spec=spec, submitted_by="bench"),
                JobAdmitted(job_id=job_id, queue=team, priority="research"),
                GangReserved(job_id=job_id, attempt=1, ranks=[placement]),
                TaskStarted(job_id=job_id, attempt=1, rank=0, node_id="n1"),
            )
            apply(at + timedelta(hours=3), JobSucceeded(job_id=job_id, attempt=1))
            at += step
    return models


def timed(call: object, repeat: int) -> list[float]:
    assert callable(call)
    times = []
    for _ in range(repeat):
        began = time.process_time()
        call()
        times.append((time.process_time() - began) * 1000)
    return times


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--teams", type=int, default=200)
    parser.add_argument("--jobs", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    models = build(args.teams, args.jobs)
    now = START + timedelta(days=60)
    start, end = now - timedelta(days=30), now
    intervals = len(models.usage.allocated)
    print(f"usage book: {args.teams} teams x {args.jobs} jobs, {intervals} allocated intervals")
    for label, teams in (("one team", {"team7"}), ("every team", None)):
        times = timed(
            lambda teams=teams: report(
                models.usage, start=start, end=end, by="day", now=now, teams=teams
            ),
            args.repeat,
        )
        print(
            f"report of {label}: median {statistics.median(times):.2f} ms CPU, "
            f"max {max(times):.2f} ms ({args.repeat} runs)"
        )


if __name__ == "__main__":
    main()
