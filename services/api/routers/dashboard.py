"""The web dashboard: a static page at `/` and its data behind the usual bearer tokens.

- `GET /` and `GET /ui/{file}`: the page and its script and style (services/api/ui/, plain
  JavaScript and CSS, no build step, nothing fetched from elsewhere). They hold no data, so they
  need no token; the page asks for one and keeps it in the browser's local storage.
- `GET /v1/dashboard`: one snapshot (services/api/projections/dashboard.py) for the caller.
- `GET /v1/dashboard/stream`: server-sent events, a `snapshot` event at once, whenever the read
  models move, and every few seconds for the GPUs' activity (telemetry is not in the log).
  The page reads it with `fetch` (EventSource cannot send an Authorization header). Left out
  of the OpenAPI document: it never ends, which generated-request tests cannot use.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import FileResponse, StreamingResponse

from services.api.auth import Principal
from services.api.bootstrap import ApiContext
from services.api.deps import Caller, Context, Models, still_authorized
from services.api.problems import PROBLEM_RESPONSES, not_found
from services.api.projections.dashboard import snapshot
from services.api.streams import StreamSlot

UI = Path(__file__).resolve().parent.parent / "ui"
# The files the page is made of, and nothing else: a request never names a path.
UI_FILES = {"app.js": "text/javascript", "style.css": "text/css"}
# The stream's longest silence: a snapshot at least this often (activity, elapsed times), which
# also keeps proxies from closing an idle connection.
ACTIVITY_S = 5.0

router = APIRouter(tags=["dashboard"], responses=PROBLEM_RESPONSES)


@router.get("/", include_in_schema=False)
async def index() -> FileResponse:
    return FileResponse(UI / "index.html", media_type="text/html", headers=_NO_STORE)


@router.get("/ui/{name}", include_in_schema=False)
async def asset(name: str) -> FileResponse:
    if name not in UI_FILES:
        raise not_found(f"/ui/{name}")
    return FileResponse(UI / name, media_type=UI_FILES[name], headers=_NO_STORE)


_NO_STORE = {"Cache-Control": "no-store"}


@router.get(
    "/v1/dashboard",
    operation_id="getDashboard",
    summary="What the dashboard shows: the GPU grid, the queue, usage, queue waits",
)
async def get_dashboard(caller: Caller, models: Models, context: Context) -> dict[str, Any]:
    return snapshot(models, caller, activity=context.activity)


@router.get("/v1/dashboard/stream", include_in_schema=False)
async def stream_dashboard(
    request: Request,
    caller: Caller,
    context: Context,
    interval: Annotated[float, Query(ge=0.05, le=60)] = 1.0,
) -> StreamingResponse:
    # A team holds only so many streams open (services/api/streams.py); the admin any number.
    slot = None
    if caller.team is not None:
        slot = context.streams.admit(caller.team, context.settings.streams_per_team)

    async def events(slot: StreamSlot | None) -> AsyncIterator[str]:
        try:
            async for event in _snapshots(request, caller, context, interval):
                yield event
        finally:
            if slot is not None:
                context.streams.leave(slot)

    return StreamingResponse(
        events(slot),
        media_type="text/event-stream",
        headers={**_NO_STORE, "X-Accel-Buffering": "no"},
    )


async def _snapshots(
    request: Request, caller: Principal, context: ApiContext, interval: float
) -> AsyncIterator[str]:
    """A snapshot at once, then whenever the log moves (at most every `interval`), until the
    client leaves or its token is revoked."""
    sent_at: int | None = None
    idle = 0.0
    while not await request.is_disconnected():
        models = await context.fresh()
        position = models.watermark.position
        # GPU activity changes without events: it is redrawn at least every ACTIVITY_S.
        if position != sent_at or idle >= ACTIVITY_S:
            if not await still_authorized(request, context):
                return  # the token was revoked since the stream opened
            sent_at = position
            idle = 0.0
            view = snapshot(models, caller, activity=context.activity)
            yield f"event: snapshot\ndata: {json.dumps(view)}\n\n"
        await asyncio.sleep(interval)
        idle += interval
