"""Showback counts CPUs too: a CPU-only gang's CPU-hours from its reservation to its release,
and a queue's read model holds its gangs' CPUs and memory exactly while they hold them."""

from __future__ import annotations

from datetime import timedelta

from schemas.jobs import GangReserved, JobAdmitted, JobSucceeded, RankPlacement
from services.api.projections.usage import report
from tests.api.builders import node, submitted
from tests.api.test_usage import MIDNIGHT, Clock, started


def test_a_cpu_only_gang_is_shown_back_in_cpu_hours_and_held_by_its_queue_meanwhile() -> None:
    clock = Clock()
    prep = submitted("p1", tasks=3, gpus_per_task=0, cpus_per_task=2, memory_mb_per_task=512)
    clock.at(0, node("n1"), prep)
    clock.at(0, JobAdmitted(job_id="p1", queue="nlp", priority="research"))
    ranks = [RankPlacement(rank=r, node_id="n1", gpus=[]) for r in range(3)]
    clock.at(1, GangReserved(job_id="p1", attempt=1, ranks=ranks), *started("p1", 3))
    models = clock.models
    assert (models.allocated_cpus_by_queue["nlp"], models.allocated_memory_by_queue["nlp"]) == (
        6000,
        1536,
    )

    clock.at(6, JobSucceeded(job_id="p1", attempt=1))

    assert (models.allocated_cpus_by_queue["nlp"], models.allocated_memory_by_queue["nlp"]) == (
        0,
        0,
    )
    [row] = report(
        models.usage,
        start=MIDNIGHT,
        end=MIDNIGHT + timedelta(days=1),
        by="day",
        now=MIDNIGHT + timedelta(days=1),
    )
    assert (row.allocated_gpu_hours, row.allocated_cpu_hours) == (0, 6 * 5)
