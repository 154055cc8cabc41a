"""Admin: create teams (with their token), configure queues, drain and undrain nodes."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, status

from schemas.jobs import NAME_PATTERN
from services.api.deps import Admin, Caller, Context, Models
from services.api.models import (
    DrainBody,
    NodeView,
    QueueConfig,
    QueuePatch,
    QueueView,
    TeamCreate,
    TeamCreatedView,
    TeamList,
)
from services.api.problems import PROBLEM_RESPONSES
from services.api.routers.teams import team_view
from services.api.routing import ApiRoute
from services.api.views import node_view, queue_view

NodeId = Annotated[str, Path(pattern=r"^[A-Za-z0-9._-]{1,128}$", description="the node's id")]

router = APIRouter(prefix="/v1", tags=["admin"], responses=PROBLEM_RESPONSES, route_class=ApiRoute)


@router.post(
    "/teams",
    operation_id="createTeam",
    status_code=status.HTTP_201_CREATED,
    summary="Create a team and its queue; the token is returned once",
)
async def create_team(
    body: TeamCreate, admin: Admin, context: Context, models: Models
) -> TeamCreatedView:
    # `models`: the quota tree is checked against read models caught up with the log.
    token = await context.commands.create_team(body)
    return TeamCreatedView(name=body.name, queue=body.name, token=token)


@router.get(
    "/teams",
    operation_id="listTeams",
    tags=["teams"],
    summary="Teams by name: the admin sees every team, a team's token its own",
)
async def list_teams(caller: Caller, models: Models) -> TeamList:
    visible = (
        team
        for name, team in sorted(models.teams.items())
        if caller.is_admin or name == caller.team
    )
    return TeamList(items=[team_view(team, models) for team in visible])


@router.put("/queues/{name}", operation_id="configureQueue", summary="Set a queue's quota")
async def configure_queue(
    name: Annotated[str, Path(pattern=NAME_PATTERN)],
    body: QueueConfig,
    admin: Admin,
    context: Context,
    models: Models,
) -> QueueView:
    queue = await context.commands.configure_queue(name, body)
    return queue_view(queue, context.models)


@router.patch(
    "/queues/{name}",
    operation_id="patchQueue",
    summary="Change only the given fields of a queue's quota",
)
async def patch_queue(
    name: Annotated[str, Path(pattern=NAME_PATTERN)],
    body: QueuePatch,
    admin: Admin,
    context: Context,
    models: Models,
) -> QueueView:
    queue = await context.commands.patch_queue(name, body)
    return queue_view(queue, context.models)


@router.post(
    "/nodes/{node_id}/drain",
    operation_id="drainNode",
    summary="Drain a node: no new work; running gangs are checkpointed and moved "
    "(after the deadline, if one is given); it stays drained until undrained",
)
async def drain_node(node_id: NodeId, body: DrainBody, admin: Admin, context: Context) -> NodeView:
    node = await context.commands.drain_node(admin, node_id, body)
    return node_view(node, context.models, admin)


@router.post(
    "/nodes/{node_id}/undrain",
    operation_id="undrainNode",
    summary="Return a drained node to service",
)
async def undrain_node(node_id: NodeId, admin: Admin, context: Context) -> NodeView:
    node = await context.commands.undrain_node(admin, node_id)
    return node_view(node, context.models, admin)
