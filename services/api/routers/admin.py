"""Admin: create teams (with their token) and configure queues."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, status

from schemas.jobs import NAME_PATTERN
from services.api.deps import Admin, Context
from services.api.models import QueueConfig, QueueView, TeamCreate, TeamCreatedView
from services.api.problems import PROBLEM_RESPONSES
from services.api.strict import StrictJsonRoute
from services.api.views import queue_view

router = APIRouter(
    prefix="/v1", tags=["admin"], responses=PROBLEM_RESPONSES, route_class=StrictJsonRoute
)


@router.post(
    "/teams",
    operation_id="createTeam",
    status_code=status.HTTP_201_CREATED,
    summary="Create a team and its queue; the token is returned once",
)
async def create_team(body: TeamCreate, admin: Admin, context: Context) -> TeamCreatedView:
    token = await context.commands.create_team(body)
    return TeamCreatedView(name=body.name, queue=body.name, token=token)


@router.put("/queues/{name}", operation_id="configureQueue", summary="Set a queue's quota")
async def configure_queue(
    name: Annotated[str, Path(pattern=NAME_PATTERN)],
    body: QueueConfig,
    admin: Admin,
    context: Context,
) -> QueueView:
    queue = await context.commands.configure_queue(name, body)
    return queue_view(queue, context.models)
