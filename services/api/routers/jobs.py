"""/v1/jobs: submit, read, list, and ask to cancel, suspend or resume jobs."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, Path, Query, status

from schemas.jobs import JobSpec, JobState
from services.api.deps import Caller, Context, Models
from services.api.models import EventList, JobCreatedView, JobPage, JobView
from services.api.problems import PROBLEM_RESPONSES
from services.api.strict import StrictJsonRoute
from services.api.views import event_view, job_view

# Ids are drawn by the API ([0-9a-f]); the pattern keeps odd bytes (NUL) away from the log.
JobId = Annotated[str, Path(pattern=r"^[A-Za-z0-9._-]{1,64}$", description="the job's id")]

router = APIRouter(
    prefix="/v1/jobs", tags=["jobs"], responses=PROBLEM_RESPONSES, route_class=StrictJsonRoute
)


@router.post(
    "",
    operation_id="submitJob",
    status_code=status.HTTP_201_CREATED,
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
    job = await context.commands.submit(caller, spec, idempotency_key=idempotency_key)
    return JobCreatedView(id=job.id, state=job.state)


@router.get("", operation_id="listJobs", summary="List jobs, oldest first, a page at a time")
async def list_jobs(
    caller: Caller,
    models: Models,
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
    start = after or 0
    matching = sorted(
        (
            job
            for job in models.jobs.values()
            if job.submit_position > start
            and (team is None or job.spec.team == team)
            and (state is None or job.state == state)
        ),
        key=lambda job: job.submit_position,
    )
    page = matching[:limit]
    more = len(matching) > limit
    return JobPage(
        items=[job_view(job) for job in page],
        next=page[-1].submit_position if more else None,
    )


@router.get("/{job_id}", operation_id="getJob", summary="A job: state, placement, reason")
async def get_job(job_id: JobId, caller: Caller, models: Models) -> JobView:
    return job_view(caller.visible(models.jobs.get(job_id), job_id))


@router.get(
    "/{job_id}/events", operation_id="listJobEvents", summary="The job's events, in log order"
)
async def list_job_events(
    job_id: JobId, caller: Caller, models: Models, context: Context
) -> EventList:
    caller.visible(models.jobs.get(job_id), job_id)
    events = [
        *await context.store.read_stream(f"job-{job_id}"),
        *await context.store.read_stream(f"checkpoint-{job_id}"),
    ]
    events.sort(key=lambda envelope: envelope.position or 0)
    return EventList(items=[event_view(envelope) for envelope in events])


ACCEPTED = status.HTTP_202_ACCEPTED


@router.post(
    "/{job_id}/cancel", operation_id="cancelJob", summary="Ask to cancel", status_code=ACCEPTED
)
async def cancel_job(job_id: JobId, caller: Caller, context: Context) -> JobView:
    return job_view(await context.commands.request(caller, job_id, "cancel"))


@router.post(
    "/{job_id}/suspend", operation_id="suspendJob", summary="Ask to suspend", status_code=ACCEPTED
)
async def suspend_job(job_id: JobId, caller: Caller, context: Context) -> JobView:
    return job_view(await context.commands.request(caller, job_id, "suspend"))


@router.post(
    "/{job_id}/resume", operation_id="resumeJob", summary="Ask to resume", status_code=ACCEPTED
)
async def resume_job(job_id: JobId, caller: Caller, context: Context) -> JobView:
    return job_view(await context.commands.request(caller, job_id, "resume"))
