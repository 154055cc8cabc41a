"""GET /v1/jobs/{id}/logs: a rank's output, whole, its last lines, or followed as it grows.

The same tenant rule as every job route: another team's job is 404. Which attempt: the one
asked for, else the job's current (or last) one. Which rank: the one asked for, else rank 0.
The output lives on the node the rank started on: the API asks that node's agent
(services/agent/log_server.py, found by GANGWAY_AGENT_LOGS_URL) with a request signed by the
services' shared key, and never reads a node's disk itself. `follow=true` streams (chunked text)
until the agent says the attempt is over there and everything is read; the client may hang up
any time.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Annotated
from urllib.parse import urlencode

import httpx
from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import PlainTextResponse, StreamingResponse

from services.agent.log_server import AUTH_HEADER, auth_header
from services.api.deps import Caller, Context, Models, still_authorized
from services.api.problems import PROBLEM_RESPONSES, ProblemError, not_found
from services.api.projections.jobs import JobReadModel
from services.api.streams import StreamSlot

JobId = Annotated[str, Path(pattern=r"^[A-Za-z0-9._-]{1,64}$", description="the job's id")]

router = APIRouter(prefix="/v1/jobs", tags=["jobs"], responses=PROBLEM_RESPONSES)

TEXT = "text/plain; charset=utf-8"


@dataclass(frozen=True, slots=True)
class RankLog:
    """A rank's log on its agent: where to ask, and with which key."""

    job_id: str
    attempt: int
    rank: int
    agent_url: str
    key: bytes


@dataclass(frozen=True, slots=True)
class Chunk:
    data: bytes
    offset: int
    ended: bool


async def _fetch(
    client: httpx.AsyncClient, source: RankLog, *, offset: int = 0, tail: int | None = None
) -> Chunk | None:
    """Bytes of the rank's log from `offset` (or its last `tail` lines); None: no log there."""
    params: dict[str, int] = {"offset": offset} if tail is None else {"tail": tail}
    target = f"/v1/logs/{source.job_id}/{source.attempt}/{source.rank}?{urlencode(params)}"
    try:
        response = await client.get(
            source.agent_url.rstrip("/") + target,
            headers={AUTH_HEADER: auth_header(source.key, "GET", target)},
        )
    except httpx.HTTPError as error:
        raise ProblemError(
            503, "agent-unavailable", f"the node's agent did not answer ({type(error).__name__})"
        ) from error
    if response.status_code == 404:
        return None
    if response.status_code != 200:
        raise ProblemError(502, "agent-error", f"the node's agent answered {response.status_code}")
    return Chunk(
        response.content,
        int(response.headers.get("X-Gangway-Offset", offset)),
        response.headers.get("X-Gangway-Ended") == "true",
    )


def _source(
    job: JobReadModel, context: Context, models: Models, attempt: int, rank: int
) -> RankLog | None:
    node_id = job.rank_nodes.get((attempt, rank))
    if node_id is None:
        return None
    node = models.nodes.get(node_id)
    hostname = node.hostname if node is not None else node_id
    url = context.settings.agent_logs_url.format(node=node_id, hostname=hostname)
    return RankLog(job.id, attempt, rank, url, context.settings.bus_signing_key)


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
    elements = models.arrays.get(job_id) if job_id not in models.jobs else None
    if elements:
        # An array's id (what `gangway submit` printed) has no output of its own: say so and
        # name its elements, once the caller may see them (another team learns nothing).
        caller.visible(models.jobs.get(elements[0]), job_id)
        raise ProblemError(
            404,
            "not-found",
            f"job {job_id} is an array of {len(elements)} jobs and has no output of its own: "
            f"ask for one of its elements ({elements[0]} … {elements[-1]})",
        )
    job = caller.visible(models.jobs.get(job_id), job_id)
    chosen = attempt if attempt is not None else job.attempt
    if chosen == 0:
        raise not_found(f"output of job {job_id} (it has not started)")
    if chosen > job.attempt:
        attempts = "1 attempt" if job.attempt == 1 else f"{job.attempt} attempts"
        raise ProblemError(
            404, "not-found", f"job {job_id} has no attempt {chosen}: it has had {attempts}"
        )
    if rank >= job.spec.tasks and all(r != rank for _, r in job.rank_nodes):
        # A rank the job never had (nor had before an update of its spec): say which it has,
        # not that its output is missing.
        ranks = (
            "its only rank is 0"
            if job.spec.tasks == 1
            else f"its ranks are 0 … {job.spec.tasks - 1}"
        )
        raise ProblemError(404, "not-found", f"job {job_id} has no rank {rank}: {ranks}")
    missing = _missing(job, chosen, rank)
    source = _source(job, context, models, chosen, rank)
    if source is None:
        raise missing
    slot = None
    if follow and caller.team is not None:
        slot = context.streams.admit(caller.team, context.settings.streams_per_team)
    client = httpx.AsyncClient(timeout=context.settings.agent_logs_timeout_s)
    try:
        first = await _fetch(client, source, tail=tail)
        if first is None and not (follow and not job.terminal):
            raise missing
    except BaseException:
        await client.aclose()
        if slot is not None:
            context.streams.leave(slot)
        raise
    if first is None:
        # Following a rank that has not written yet: from the start, when it does.
        first = Chunk(b"", 0, False)
    stream = (
        _follow(request, context, client, source, first, slot)
        if follow
        else _read(client, source, first)
    )
    return StreamingResponse(stream, media_type=TEXT, headers=_headers(source))


def _missing(job: JobReadModel, attempt: int, rank: int) -> ProblemError:
    """404 for a rank with no output; for a job that ended, with the job's reason, which says
    why a rank never wrote (its launch failed: no such program …)."""
    missing = not_found(f"output of rank {rank} of attempt {attempt} of job {job.id}")
    if job.terminal and job.reason:
        return ProblemError(
            404, "not-found", f"{missing.detail} (the job is {job.state}: {job.reason})"
        )
    return missing


def _headers(source: RankLog) -> dict[str, str]:
    return {
        "X-Gangway-Attempt": str(source.attempt),
        "X-Gangway-Rank": str(source.rank),
        "Cache-Control": "no-store",
    }


async def _rest(client: httpx.AsyncClient, source: RankLog, first: Chunk) -> AsyncIterator[Chunk]:
    """`first` (when not empty), then the rest of the log as it is now."""
    chunk: Chunk | None = first
    while chunk is not None and chunk.data:
        yield chunk
        chunk = await _fetch(client, source, offset=chunk.offset + len(chunk.data))


async def _read(client: httpx.AsyncClient, source: RankLog, first: Chunk) -> AsyncIterator[bytes]:
    try:
        async for chunk in _rest(client, source, first):
            yield chunk.data
    finally:
        await client.aclose()


async def _follow(
    request: Request,
    context: Context,
    client: httpx.AsyncClient,
    source: RankLog,
    first: Chunk,
    slot: StreamSlot | None,
) -> AsyncIterator[bytes]:
    """Everything from `first`, then what is appended, until the attempt is over and read
    (or the caller's token is revoked); then the team's follow `slot` is given back."""
    poll = context.settings.logs_poll_s
    offset = first.offset
    pending: Chunk | None = first
    try:
        while True:
            # Whether the attempt was over BEFORE the next read: then that read gets everything.
            models = await context.fresh()
            job = models.jobs.get(source.job_id)
            over = job is None or job.terminal or job.attempt > source.attempt
            if pending is None:
                pending = await _fetch(client, source, offset=offset)
            if pending is None:
                # Nothing new to show: asked once a poll all the same, so that a revoked
                # token's stream ends rather than waits for output.
                if not await still_authorized(request, context):
                    return
            else:
                async for chunk in _rest(client, source, pending):
                    # Asked once the bytes are read, before they are shown: what was written
                    # after a revocation is read after it, so this check sees it.
                    if not await still_authorized(request, context):
                        return
                    offset = chunk.offset + len(chunk.data)
                    yield chunk.data
            pending = None
            if over:
                return
            await asyncio.sleep(poll)
    finally:
        if slot is not None:
            context.streams.leave(slot)
        await client.aclose()
