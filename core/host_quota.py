"""CPU and memory ceilings of the queue tree (`max_cpus`, `max_memory_mb` of a queue).

A queue may cap what its subtree holds at once of the hosts' CPUs and memory, as `max_gpus`
caps its GPUs: a team's preprocessing cannot take every CPU of the fleet although it asks
no GPU. They are ceilings only, with no guarantee and no borrowing past them: a gang that
would pass one waits (`quota_ceiling_cpus`, `quota_ceiling_memory`) until the queue's own
gangs end, and never preempts another queue's work for it. Admission refuses for good a gang
whose least size could never fit under a ceiling of its chain (`over_quota_max`).

An elastic gang takes only as many tasks as the ceilings leave room for, down to its
minimum; a slice or share gang is placed whole, so it needs room for every task.
"""

from __future__ import annotations

from dataclasses import replace

from core.context import Outcome
from core.quota import QuotaBook
from core.shape import Shape, cpus_text
from core.state import CoreJob
from schemas.reasons import DeferCode

QUOTA_CEILING_CPUS: DeferCode = "quota_ceiling_cpus"
QUOTA_CEILING_MEMORY: DeferCode = "quota_ceiling_memory"


def within_host_ceilings(
    quota: QuotaBook, job: CoreJob, shape: Shape, *, whole: bool
) -> Shape | Outcome:
    """The shape the gang may take under its chain's host ceilings (fewer tasks for an
    elastic gang where the ceiling leaves less room), or why it waits.

    `whole`: the gang is placed with every task or not at all (slices and shares)."""
    if not shape.asks_host:
        return shape
    room = quota.host_room(job.queue, shape.cpus_milli, shape.memory_mb)
    if room.tasks is None:
        return shape
    per_unit = shape.tasks_per_unit
    least = (shape.units if whole else shape.min_units) * per_unit
    if room.tasks < least:
        return _deferred(job, room.queue, room.resource, room.limit)
    units = room.tasks // per_unit
    return replace(shape, units=units) if units < shape.units else shape


def charge_tasks(quota: QuotaBook, job: CoreJob, shape: Shape, tasks: int) -> None:
    """Account `tasks` placed tasks' CPUs and memory to the queue's chain."""
    if shape.asks_host:
        quota.charge_host(job.queue, shape.cpus_milli * tasks, shape.memory_mb * tasks)


def _deferred(job: CoreJob, queue: str | None, resource: str | None, limit: int | None) -> Outcome:
    assert queue is not None and limit is not None
    if resource == "cpus":
        return Outcome(
            QUOTA_CEILING_CPUS,
            f"{job.need}; queue {queue} would exceed its ceiling of {cpus_text(limit)} CPUs",
        )
    return Outcome(
        QUOTA_CEILING_MEMORY,
        f"{job.need}; queue {queue} would exceed its ceiling of {limit} MB of memory",
    )
