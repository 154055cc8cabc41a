"""/v1/events: the audit over the log, cursor-paged by position."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from schemas.envelope import EventEnvelope
from services.api.audit import read_positions
from services.api.auth import Principal
from services.api.bootstrap import ApiContext
from services.api.deps import Caller, Context, Models, answer_weighed
from services.api.models import EventPage
from services.api.problems import PROBLEM_RESPONSES
from services.api.projections.model import ReadModels
from services.api.views import envelope_bytes, event_view

router = APIRouter(prefix="/v1/events", tags=["events"], responses=PROBLEM_RESPONSES)

# Positions are PostgreSQL bigints.
MAX_POSITION = 2**63 - 1


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
    if caller.team is not None:
        async with context.audit_gate.slot(caller.team):
            page = _team_page(caller.team, caller, models, context, after, types, stream, limit)
            return await page
    items = await context.store.read_all(after, limit, types=types or None, stream=stream)
    cursor = items[-1].position or after if items else after
    return EventPage(
        items=[event_view(e, caller, models.jobs) for e in items],
        next=cursor,
        has_more=len(items) == limit,
    )


async def _team_page(
    team: str,
    caller: Principal,
    models: ReadModels,
    context: ApiContext,
    after: int,
    types: list[str],
    stream: str | None,
    limit: int,
) -> EventPage:
    """The team's own events after `after`: their positions come from the team's audit index
    and are read by primary key, so the cost follows this team's events, not the log's."""
    # Only what the read models have applied is indexed: never page past their watermark, or
    # an event indexed later at an earlier position would be skipped by the cursor.
    ceiling = models.watermark.position
    items: list[EventEnvelope] = []
    cursor = after
    scanned = 0
    while len(items) < limit and scanned < context.settings.events_scan_limit:
        chunk = [p for p in models.audit.after(team, cursor, limit) if p <= ceiling]
        if not chunk:
            break
        scanned += len(chunk)
        batch = await read_positions(context.store, chunk, types, stream)
        for envelope in batch[: limit - len(items)]:
            items.append(envelope)
        if len(items) == limit:
            cursor = items[-1].position or cursor
            break
        cursor = chunk[-1]
    more = [p for p in models.audit.after(team, cursor, 1) if p <= ceiling]
    answer_weighed(caller, context, sum(map(envelope_bytes, items)), read=True)
    items_seen = [event_view(e, caller, models.jobs) for e in items]
    return EventPage(items=items_seen, next=cursor, has_more=bool(more))
