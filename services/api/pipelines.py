"""Turning submitted specs into JobSubmitted events: arrays, dependencies, batches.

One request (a single job, an array, or a batch of either) becomes the events of all its jobs,
checked together before anything is written, so that the append is all or nothing:

- every spec is checked as a single submission would be (`check_submission`);
- an array of `count` becomes `count` jobs `ID_0 … ID_{count-1}` sharing the spec;
- a dependency names an existing job of the same team, an array of it (all its elements), or,
  inside a batch, another job of the batch and of the same team by its `name`; it is recorded
  by job id; a name that is both (a job of the batch named like an existing job's id) is
  refused as ambiguous, never resolved silently either way;
- a dependency graph inside a batch must be acyclic (jobs already in the log can only name
  older jobs, so a cycle can only be written by one batch);
- at most `MAX_SUBMIT_JOBS` jobs per request, counting every array element, and at most
  `MAX_SUBMIT_SPEC_BYTES` of specs recorded (an array records its spec once per element: a
  body within the cap could otherwise write a thousand times its size into the log every
  team shares).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

from core.dependencies import find_cycle
from schemas.jobs import (
    MAX_DEPENDENCIES,
    Dependency,
    JobSpec,
    JobSubmitted,
    array_element_id,
)
from services.api.auth import Principal
from services.api.problems import FieldError, ProblemError
from services.api.projections.model import ReadModels
from services.api.validation import check_submission

# The most jobs one request may create (array elements count one each): one append stays well
# under what the log writes in one transaction and what a scheduling cycle takes in at once.
MAX_SUBMIT_JOBS: Final = 1000
# The most spec JSON one request may record, every array element's copy counted: a thousand
# elements of a 16 KiB spec (a typical spec is under 2 KiB).
MAX_SUBMIT_SPEC_BYTES: Final = 16 * 1024 * 1024
# The ids the API draws (commands.new_job_id, idempotent_job_id) and their array elements: only
# a batch's name of this shape can also be an existing job's id.
DRAWN_JOB_ID: Final = re.compile(r"[0-9a-f]{12}(_[0-9]+)?")


@dataclass(frozen=True, slots=True)
class PlannedJob:
    """One submitted spec: its id (the array's, for an array) and the events it becomes."""

    id: str
    events: list[JobSubmitted]

    @property
    def element_ids(self) -> list[str] | None:
        first = self.events[0]
        return None if first.array_id is None else [event.job_id for event in self.events]


def plan_submissions(
    principal: Principal,
    specs: Sequence[JobSpec],
    models: ReadModels,
    ids: Sequence[str],
    *,
    batch: bool,
    storable: Callable[[JobSpec], int],
) -> list[PlannedJob]:
    """The events of every spec, or a ProblemError naming each invalid one (a batch), or the
    first problem as a single submission reports it (not a batch)."""
    total = sum(map(_width, specs))
    if total > MAX_SUBMIT_JOBS:
        raise ProblemError(
            422,
            "too-many-jobs",
            f"one request may create at most {MAX_SUBMIT_JOBS} jobs (array elements count "
            f"one each); this one would create {total}",
        )
    for spec in specs:
        principal.require_team(spec.team)
    # A batch's names are the team's own: a job of another team of the batch (an admin's
    # batch may hold several teams) is as unknown to it as any other team's job.
    by_name: dict[tuple[str, str], list[int]] = {}
    if batch:
        for index, spec in enumerate(specs):
            by_name.setdefault((spec.team, spec.name), []).append(index)
    errors: list[tuple[int, ProblemError]] = []
    edges: dict[str, list[str]] = {}
    resolved: list[JobSpec] = []
    # Bytes of spec JSON the request would record: each array element records its spec.
    recorded = 0
    for index, spec in enumerate(specs):
        try:
            recorded += storable(spec) * (spec.array.count if spec.array is not None else 1)
            check_submission(spec, models)
            depends, refs = _resolve(spec, index, specs, ids, by_name, models)
        except ProblemError as problem:
            errors.append((index, problem))
            resolved.append(spec)
            continue
        edges[str(index)] = [str(ref) for ref in refs]
        resolved.append(spec.model_copy(update={"depends_on": depends}) if depends else spec)
    if not errors:
        cycle = find_cycle(sorted(edges), edges)
        if cycle is not None:
            names = " → ".join(specs[int(index)].name for index in cycle)
            detail = f"the dependencies form a cycle: {names}"
            errors.append((int(cycle[0]), ProblemError(422, "dependency-cycle", detail)))
    if errors:
        raise _refusal(errors, batch=batch)
    _require_recordable(recorded)
    return [_events(principal, spec, job_id) for spec, job_id in zip(resolved, ids, strict=True)]


def planned_ids(
    principal: Principal, specs: Sequence[JobSpec], ids: Sequence[str]
) -> list[PlannedJob]:
    """The jobs `specs` were planned as under `ids`, unchecked and their dependencies not
    resolved: what a retried request created is found by these ids and streams, and these
    events are never written."""
    return [_events(principal, spec, job_id) for spec, job_id in zip(specs, ids, strict=True)]


def _require_recordable(recorded: int) -> None:
    """413 when the request would record more than `MAX_SUBMIT_SPEC_BYTES` of specs."""
    if recorded > MAX_SUBMIT_SPEC_BYTES:
        raise ProblemError(
            413,
            "payload-too-large",
            f"the request would record {recorded} bytes of job specs (an array's spec once "
            f"per element); at most {MAX_SUBMIT_SPEC_BYTES}: make the array's spec smaller "
            "or submit it as smaller arrays",
        )


def _resolve(
    spec: JobSpec,
    index: int,
    specs: Sequence[JobSpec],
    ids: Sequence[str],
    by_name: dict[tuple[str, str], list[int]],
    models: ReadModels,
) -> tuple[list[Dependency], list[int]]:
    """The spec's dependencies by job id, and the other items of the batch it names."""
    # Each dependency's jobs: another item of the batch (its index) or existing ids.
    chosen: list[tuple[Dependency, int | Sequence[str]]] = []
    refs: list[int] = []
    for position, dependency in enumerate(spec.depends_on):
        where = f"depends_on[{position}]"
        named = by_name.get((spec.team, dependency.job))
        if named is not None:
            if owned(dependency.job, spec.team, models) is not None:
                raise ProblemError(
                    422,
                    "ambiguous-dependency",
                    f"{where}: {dependency.job!r} is both the name of a job of this request and "
                    f"the id of an existing job of team {spec.team!r}; rename the request's job",
                )
            if len(named) > 1:
                raise ProblemError(
                    422,
                    "ambiguous-dependency",
                    f"{where}: {len(named)} jobs of this request are named {dependency.job!r}",
                )
            other = named[0]
            if other == index:
                raise ProblemError(
                    422, "dependency-cycle", f"{where}: job {spec.name!r} depends on itself"
                )
            refs.append(other)
            chosen.append((dependency, other))
        else:
            chosen.append((dependency, _existing(dependency.job, spec.team, models, where)))
    # Counted before any is built: 64 names of an array of 1,000 are 64,000 dependencies, and
    # a batch of such specs held the worker (every team's requests) for minutes to refuse it.
    count = sum(_width(specs[jobs]) if isinstance(jobs, int) else len(jobs) for _, jobs in chosen)
    if count > MAX_DEPENDENCIES:
        raise ProblemError(
            422,
            "too-many-dependencies",
            f"depends_on names {count} jobs (array elements count one each); "
            f"at most {MAX_DEPENDENCIES}",
        )
    # Each (job, condition) once: a job named twice, or by its name and by its id, or as an
    # array and as one of its elements, is one dependency.
    conditions: dict[tuple[str, str], None] = {}
    for dependency, jobs in chosen:
        for job in _ids_of(specs[jobs], ids[jobs]) if isinstance(jobs, int) else jobs:
            conditions[(job, dependency.condition)] = None
    for job, condition in conditions:
        if condition == "succeeded" and (job, "failed") in conditions:
            raise ProblemError(
                422,
                "contradictory-dependency",
                f"depends_on asks job {job!r} to have both succeeded and failed: the job "
                "could never start",
            )
    depends = [Dependency(job=job, condition=condition) for job, condition in conditions]
    return depends, refs


def _width(spec: JobSpec) -> int:
    """How many jobs the spec becomes (an array's count)."""
    return 1 if spec.array is None else spec.array.count


def _ids_of(spec: JobSpec, job_id: str) -> list[str]:
    if spec.array is None:
        return [job_id]
    return [array_element_id(job_id, index) for index in range(spec.array.count)]


def owned(job_id: str, team: str, models: ReadModels) -> Sequence[str] | None:
    """The ids of an existing job (or every element of an array) of `team`, else None; another
    team's is as unknown as a missing one, so that a team learns nothing of other teams' jobs
    by naming them. An array's are the read model's own list (not copied: a spec may name an
    array of 1,000 elements 64 times), to be read, never changed."""
    job = models.jobs.get(job_id)
    if job is not None and job.spec.team == team:
        return [job_id]
    elements = models.arrays.get(job_id)
    if elements and models.jobs[elements[0]].spec.team == team:
        return elements
    return None


def _existing(job_id: str, team: str, models: ReadModels, where: str) -> Sequence[str]:
    jobs = owned(job_id, team, models)
    if jobs is not None:
        return jobs
    raise ProblemError(
        422, "unknown-dependency", f"{where}: there is no job {job_id!r} of team {team!r}"
    )


def _events(principal: Principal, spec: JobSpec, job_id: str) -> PlannedJob:
    if spec.array is None:
        return PlannedJob(
            job_id, [JobSubmitted(job_id=job_id, spec=spec, submitted_by=principal.name)]
        )
    return PlannedJob(
        job_id,
        [
            JobSubmitted(
                job_id=array_element_id(job_id, index),
                spec=spec,
                submitted_by=principal.name,
                array_id=job_id,
                array_index=index,
            )
            for index in range(spec.array.count)
        ],
    )


def _refusal(errors: list[tuple[int, ProblemError]], *, batch: bool) -> ProblemError:
    first_index, first = errors[0]
    if not batch:
        return first
    statuses = {problem.status for _, problem in errors}
    return ProblemError(
        first.status if len(statuses) == 1 else 422,
        first.slug if len(errors) == 1 else "invalid-batch",
        f"{len(errors)} of the batch's jobs are invalid, nothing was submitted; "
        f"jobs[{first_index}]: {first.detail}",
        errors=[
            FieldError(loc=["body", "jobs", index], msg=problem.detail, type=problem.slug)
            for index, problem in errors
        ],
    )
