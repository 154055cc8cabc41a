"""/v1/jobs: submit (one, an array, or a batch), read, list, change a waiting job, hold and
release it, and ask to cancel, suspend or resume jobs.

An array's id (the `id` of its 201 body) stands for the whole array: GET answers an
ArrayView, and cancel, suspend, resume, hold, release and PATCH act on every element (one
element is `ID_3`).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, Path, Query, status

from schemas.jobs import JobChanges, JobSpec, JobState
from services.api.auth import Principal
from services.api.bootstrap import ApiContext
from services.api.deps import Caller, Context, Models, answer_weighed, command_turn
from services.api.models import (
    ArrayView,
    BatchCreatedView,
    BatchSubmit,
    EventList,
    JobCreatedView,
    JobPage,
    JobPatch,
    JobView,
)
from services.api.pipelines import PlannedJob
from services.api.problems import PROBLEM_RESPONSES
from services.api.projections.jobs import JobReadModel, Request
from services.api.routing import ApiRoute
from services.api.views import array_view, envelope_bytes, event_view, job_view, spec_bytes

# Ids are drawn by the API ([0-9a-f]); the pattern keeps odd bytes (NUL) away from the log.
JobId = Annotated[str, Path(pattern=r"^[A-Za-z0-9._-]{1,64}$", description="the job's id")]

router = APIRouter(
    prefix="/v1/jobs", tags=["jobs"], responses=PROBLEM_RESPONSES, route_class=ApiRoute
)


@router.post(
    "",
    operation_id="submitJob",
    status_code=status.HTTP_201_CREATED,
    response_model_exclude_none=True,
    summary="Submit a job (admission decides asynchronously)",
)
async def submit_job(
    spec: JobSpec,
    caller: Caller,
    context: Context,
    idempotency_key: Annotated[
        str | None,
        Header(
            min_length=1,
            max_length=255,
            pattern=r"^[\x21-\x7e]+$",
            description="retrying with the same key returns the job it created, never a second",
        ),
    ] = None,
) -> JobCreatedView:
    if spec.array is not None or spec.depends_on:
        [planned] = await context.commands.submit_many(
            caller, [spec], batch=False, idempotency_key=idempotency_key
        )
        return _created(planned, context)
    job = await context.commands.submit(caller, spec, idempotency_key=idempotency_key)
    return JobCreatedView(id=job.id, state=job.state)


@router.post(
    ":batch",
    operation_id="submitJobBatch",
    status_code=status.HTTP_201_CREATED,
    response_model_exclude_none=True,
    summary="Submit up to 1,000 jobs at once: all of them, or none",
    description=(
        "Each spec is checked as `POST /v1/jobs` would check it; if any is invalid nothing is "
        "written and the problem lists each invalid one under `errors` (loc `body.jobs.N`). "
        "A `depends_on[].job` may name another job of the batch by its `name`."
    ),
)
async def submit_job_batch(
    body: BatchSubmit,
    caller: Caller,
    context: Context,
    idempotency_key: Annotated[
        str | None, Header(min_length=1, max_length=255, pattern=r"^[\x21-\x7e]+$")
    ] = None,
) -> BatchCreatedView:
    planned = await context.commands.submit_many(caller, body.jobs, idempotency_key=idempotency_key)
    return BatchCreatedView(jobs=[_created(job, context) for job in planned])


def _created(planned: PlannedJob, context: Context) -> JobCreatedView:
    first = context.models.jobs[planned.events[0].job_id]
    return JobCreatedView(id=planned.id, state=first.state, array=planned.element_ids)


def _answer(
    job_id: str,
    jobs: list[JobReadModel],
    caller: Principal,
    context: ApiContext,
    *,
    read: bool = False,
) -> JobView | ArrayView:
    """One job's view, or the array's when `job_id` names an array, weighed first (a read's
    answer, `read`, is refused while the team is in debt for heavy answers)."""
    answer_weighed(caller, context, sum(spec_bytes(job.spec) for job in jobs), read=read)
    known = context.models.jobs
    if len(jobs) == 1 and jobs[0].id == job_id:
        return job_view(jobs[0], caller, known)
    return array_view(job_id, jobs, caller, known)


@router.get("", operation_id="listJobs", summary="List jobs, oldest first, a page at a time")
async def list_jobs(
    caller: Caller,
    models: Models,
    context: Context,
    team: Annotated[str | None, Query(max_length=64)] = None,
    state: JobState | None = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    after: Annotated[
        int | None, Query(ge=0, le=2**63 - 1, description="the `next` cursor of the previous page")
    ] = None,
) -> JobPage:
    if not caller.is_admin:
        if team not in (None, caller.team):
            return JobPage(items=[], next=None)  # another team's jobs are not even counted
        team = caller.team
    # A page costs its length (projections/listing.py), not a scan of every job.
    ids, cursor = models.listing.page(team, state, after or 0, limit)
    # A page also ends at about list_page_max_bytes of specs (at least one job): a spec may
    # be most of a 1 MiB body, and an array repeats it in each of up to 1,000 elements, so a
    # page of 1,000 could otherwise be a gigabyte built in this process's memory.
    budget = context.settings.list_page_max_bytes
    jobs: list[JobReadModel] = []
    weight = 0
    for job_id in ids:
        job = models.jobs[job_id]
        size = spec_bytes(job.spec)
        if jobs and weight + size > budget:
            cursor = jobs[-1].submit_position
            break
        weight += size
        jobs.append(job)
    answer_weighed(caller, context, weight, read=True)
    return JobPage(items=[job_view(job, caller, models.jobs) for job in jobs], next=cursor)


@router.get(
    "/{job_id}", operation_id="getJob", summary="A job (or an array): state, placement, reason"
)
async def get_job(
    job_id: JobId, caller: Caller, models: Models, context: Context
) -> JobView | ArrayView:
    ids = await context.commands.targets(caller, job_id)
    return _answer(job_id, [models.jobs[target] for target in ids], caller, context, read=True)


@router.patch(
    "/{job_id}",
    operation_id="updateJob",
    summary="Change a waiting job: priority class, runtimes, retries, hold",
    description=(
        "Only the fields given change, validated as a submission would be (a priority class "
        "within the team's policy); a job holding GPUs or ended answers 409."
    ),
)
async def update_job(
    job_id: JobId, body: JobPatch, caller: Caller, context: Context
) -> JobView | ArrayView:
    changes = JobChanges(
        priority=body.priority,
        estimated_runtime_s=body.estimated_runtime_s,
        max_runtime_s=body.max_runtime_s,
        max_retries=body.max_retries,
    )
    await command_turn(caller, context)
    commands = context.commands
    if changes.priority is not None:
        # Nothing after this check judges a class changed here (admission judged the submitted
        # spec): the team's policy is read at the log's head, not from this worker's fold,
        # which may not hold yet a restriction written through another worker.
        await commands.feed.reach_head()
    jobs = await commands.change(
        caller,
        job_id,
        commands.update_decision(caller, changes, body.hold),
        none_can=f"no element of array {job_id} can be changed (none is pending, queued or "
        "suspended)",
    )
    return _answer(job_id, jobs, caller, context)


@router.post(
    "/{job_id}/hold",
    operation_id="holdJob",
    summary="Hold a waiting job: it is never placed until released",
)
async def hold_job(job_id: JobId, caller: Caller, context: Context) -> JobView | ArrayView:
    await command_turn(caller, context)
    commands = context.commands
    jobs = await commands.change(
        caller,
        job_id,
        commands.hold_decision(caller),
        none_can=f"no element of array {job_id} can be held (none is waiting)",
    )
    return _answer(job_id, jobs, caller, context)


@router.post(
    "/{job_id}/release",
    operation_id="releaseJob",
    summary="Release a held job: it waits for a gang again, in its place by class and age",
)
async def release_job(job_id: JobId, caller: Caller, context: Context) -> JobView | ArrayView:
    await command_turn(caller, context)
    commands = context.commands
    decide = commands.release_decision(caller)
    none_can = f"no element of array {job_id} can be released (every one has ended)"
    jobs = await commands.change(caller, job_id, decide, none_can=none_can)
    return _answer(job_id, jobs, caller, context)


@router.get(
    "/{job_id}/events",
    operation_id="listJobEvents",
    summary="The job's events (an array's: its elements'), in log order",
)
async def list_job_events(
    job_id: JobId, caller: Caller, models: Models, context: Context
) -> EventList:
    # An array's id stands for its elements (their histories merged in log order), as in GET;
    # a job written a moment ago through another API process is read from the log first.
    ids = await context.commands.targets(caller, job_id)
    events = await context.store.read_streams(
        [f"{kind}-{target}" for target in ids for kind in ("job", "checkpoint")]
    )
    answer_weighed(caller, context, sum(map(envelope_bytes, events)), read=True)
    return EventList(items=[event_view(envelope, caller, models.jobs) for envelope in events])


ACCEPTED = status.HTTP_202_ACCEPTED


@router.post(
    "/{job_id}/cancel", operation_id="cancelJob", summary="Ask to cancel", status_code=ACCEPTED
)
async def cancel_job(job_id: JobId, caller: Caller, context: Context) -> JobView | ArrayView:
    return await _request(job_id, caller, context, "cancel")


@router.post(
    "/{job_id}/suspend", operation_id="suspendJob", summary="Ask to suspend", status_code=ACCEPTED
)
async def suspend_job(job_id: JobId, caller: Caller, context: Context) -> JobView | ArrayView:
    return await _request(job_id, caller, context, "suspend")


@router.post(
    "/{job_id}/resume", operation_id="resumeJob", summary="Ask to resume", status_code=ACCEPTED
)
async def resume_job(job_id: JobId, caller: Caller, context: Context) -> JobView | ArrayView:
    return await _request(job_id, caller, context, "resume")


async def _request(
    job_id: str, caller: Caller, context: Context, kind: Request
) -> JobView | ArrayView:
    await command_turn(caller, context)
    jobs = await context.commands.request_each(caller, job_id, kind)
    return _answer(job_id, jobs, caller, context)
