"""GET /v1/jobs/{id}/logs: a rank's output, whole, its last lines, or followed as it grows.

The same tenant rule as every job route: another team's job is 404. Which attempt: the one
asked for, else the job's current (or last) one. Which rank: the one asked for, else rank 0.
`follow=true` streams (chunked text) until the attempt is over: the job is terminal, or a newer
attempt started; the client may hang up any time.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import PlainTextResponse, StreamingResponse

from services.api import logs
from services.api.deps import Caller, Context, Models, still_authorized
from services.api.problems import PROBLEM_RESPONSES, not_found
from services.api.projections.jobs import JobReadModel

JobId = Annotated[str, Path(pattern=r"^[A-Za-z0-9._-]{1,64}$", description="the job's id")]

router = APIRouter(prefix="/v1/jobs", tags=["jobs"], responses=PROBLEM_RESPONSES)

TEXT = "text/plain; charset=utf-8"


def _attempt_of(job: JobReadModel, root_attempts: list[int], asked: int | None) -> int:
    if asked is not None:
        return asked
    if job.attempt:
        return job.attempt
    # The read model counts attempts from GangReserved; a directory may say more (or the same).
    return root_attempts[-1] if root_attempts else 0


@router.get(
    "/{job_id}/logs",
    operation_id="getJobLogs",
    summary="A rank's output (stdout and stderr): whole, its last lines, or followed",
    response_class=PlainTextResponse,
    responses={200: {"content": {TEXT: {}}, "description": "the rank's output"}},
)
async def get_job_logs(
    request: Request,
    job_id: JobId,
    caller: Caller,
    models: Models,
    context: Context,
    rank: Annotated[int, Query(ge=0, le=1_000_000, description="the rank (default 0)")] = 0,
    attempt: Annotated[
        int | None, Query(ge=1, le=1_000_000, description="the attempt (default the latest)")
    ] = None,
    follow: Annotated[bool, Query(description="keep streaming until the attempt ends")] = False,
    tail: Annotated[
        int | None, Query(ge=0, le=1_000_000, description="only the last N lines")
    ] = None,
) -> StreamingResponse:
    job = caller.visible(models.jobs.get(job_id), job_id)
    root = context.settings.logs_dir
    chosen = _attempt_of(job, await asyncio.to_thread(logs.attempts, root, job_id), attempt)
    source = logs.rank_log(root, job_id, max(chosen, 1), rank)
    exists = await asyncio.to_thread(logs.exists, source)
    if not follow:
        if not exists:
            if chosen == 0:
                raise not_found(f"output of job {job_id} (it has not started)")
            raise not_found(f"output of rank {rank} of attempt {chosen} of job {job_id}")
        offset = 0 if tail is None else await asyncio.to_thread(logs.tail_offset, source, tail)
        return StreamingResponse(_read(source, offset), media_type=TEXT, headers=_headers(source))
    if chosen and not exists and job.terminal:
        raise not_found(f"output of rank {rank} of attempt {chosen} of job {job_id}")
    offset = 0
    if exists and tail is not None:
        offset = await asyncio.to_thread(logs.tail_offset, source, tail)
    return StreamingResponse(
        _follow(request, context, source, offset),
        media_type=TEXT,
        headers=_headers(source),
    )


def _headers(source: logs.RankLog) -> dict[str, str]:
    return {
        "X-Gangway-Attempt": str(source.attempt),
        "X-Gangway-Rank": str(source.rank),
        "Cache-Control": "no-store",
    }


async def _read(source: logs.RankLog, offset: int) -> AsyncIterator[bytes]:
    while True:
        chunk = await asyncio.to_thread(logs.read_from, source, offset)
        if not chunk:
            return
        offset += len(chunk)
        yield chunk


async def _follow(
    request: Request, context: Context, source: logs.RankLog, offset: int
) -> AsyncIterator[bytes]:
    """Everything from `offset`, then what is appended, until the attempt is over and read
    (or the caller's token is revoked)."""
    poll = context.settings.logs_poll_s
    while True:
        if not await still_authorized(request, context):
            return
        # Whether the attempt was over BEFORE the last read: then that read got everything.
        models = await context.fresh()
        job = models.jobs.get(source.job_id)
        over = job is None or job.terminal or job.attempt > source.attempt
        async for chunk in _read(source, offset):
            offset += len(chunk)
            yield chunk
        if over:
            return
        await asyncio.sleep(poll)
