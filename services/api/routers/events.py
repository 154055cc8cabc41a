"""/v1/events: the audit over the log, cursor-paged by position."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from schemas.envelope import EventEnvelope
from services.api.auth import Principal
from services.api.deps import Caller, Context, Models
from services.api.models import EventPage
from services.api.problems import PROBLEM_RESPONSES
from services.api.projections.model import ReadModels
from services.api.views import event_view

router = APIRouter(prefix="/v1/events", tags=["events"], responses=PROBLEM_RESPONSES)

# Positions are PostgreSQL bigints.
MAX_POSITION = 2**63 - 1
_STREAM_JOB_PREFIXES = ("job-", "checkpoint-")


@router.get("", operation_id="listEvents", summary="Events after a position, oldest first")
async def list_events(
    caller: Caller,
    models: Models,
    context: Context,
    after: Annotated[
        int, Query(ge=0, le=MAX_POSITION, description="position to read after (the `next` cursor)")
    ] = 0,
    type: Annotated[
        list[Annotated[str, Query(pattern=r"^[A-Za-z0-9_, ]{1,1000}$")]] | None,
        Query(description="event types (repeat or comma-separate)"),
    ] = None,
    stream: Annotated[str | None, Query(pattern=r"^[A-Za-z0-9._:-]{1,200}$")] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> EventPage:
    types = sorted({name.strip() for value in type or () for name in value.split(",")} - {""})
    items: list[EventEnvelope] = []
    cursor = after
    scanned = 0
    has_more = False
    # Only a team's view needs filtering here; the log filters by type and stream itself. A
    # team's page may come back short, with a cursor past what was scanned.
    while len(items) < limit and scanned < context.settings.events_scan_limit:
        batch = await context.store.read_all(cursor, limit, types=types or None, stream=stream)
        scanned += len(batch)
        has_more = len(batch) == limit
        for envelope in batch:
            if len(items) == limit:
                has_more = True
                break
            cursor = envelope.position or cursor
            if _visible(caller, models, envelope):
                items.append(envelope)
        if not has_more:
            break
    return EventPage(items=[event_view(e) for e in items], next=cursor, has_more=has_more)


def _visible(caller: Principal, models: ReadModels, envelope: EventEnvelope) -> bool:
    if caller.is_admin:
        return True
    for prefix in _STREAM_JOB_PREFIXES:
        if envelope.stream.startswith(prefix):
            job = models.jobs.get(envelope.stream.removeprefix(prefix))
            return job is not None and caller.can_see(job)
    return envelope.stream in (f"team-{caller.team}", f"queue-{caller.team}")
