"""/v1/teams/{team}/…: a team, its policy (set by the admin), named tokens and secrets.

Tokens and secrets are the admin's or that team's own; a secret's value is write-only. The
list of teams (GET /v1/teams) is beside their creation, in routers/admin.py; both answer with
`team_view`.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Response, status

from schemas.jobs import NAME_PATTERN
from schemas.teams import TOKEN_ID_PATTERN
from services.api.deps import Admin, Caller, Context, Models, command_turn
from services.api.models import (
    SecretBody,
    SecretList,
    SecretView,
    TeamPolicyBody,
    TeamPolicyView,
    TeamView,
    TokenCreate,
    TokenCreatedView,
    TokenList,
    TokenView,
)
from services.api.problems import PROBLEM_RESPONSES, not_found
from services.api.projections.model import ReadModels
from services.api.projections.queues import TeamRecord
from services.api.routing import ApiRoute
from services.api.validation import PRIORITY_CLASSES
from services.api.views import queue_view

router = APIRouter(
    prefix="/v1/teams/{team}",
    tags=["teams"],
    responses=PROBLEM_RESPONSES,
    route_class=ApiRoute,
)

Team = Annotated[str, Path(pattern=NAME_PATTERN, description="the team's name")]
SecretName = Annotated[str, Path(pattern=NAME_PATTERN, description="the secret's name")]
TokenId = Annotated[str, Path(pattern=TOKEN_ID_PATTERN, description="the token's id")]
NO_CONTENT = status.HTTP_204_NO_CONTENT


def team_view(team: TeamRecord, models: ReadModels) -> TeamView:
    """A team with its queue's quota as configured now and what it holds and waits for."""
    queue = models.queues.get(team.name)
    usage = queue_view(queue, models) if queue is not None else None
    return TeamView(
        name=team.name,
        parent=team.parent,
        queue=team.name,
        guaranteed_gpus=usage.guaranteed_gpus if usage else team.guaranteed_gpus,
        max_gpus=usage.max_gpus if usage else team.max_gpus,
        allocated_gpus=usage.allocated_gpus if usage else 0,
        borrowed_gpus=usage.borrowed_gpus if usage else 0,
        running_jobs=usage.running_jobs if usage else 0,
        pending_jobs=usage.pending_jobs if usage else 0,
        created_at=team.created_at,
    )


@router.get("", operation_id="getTeam", summary="A team: its quota, what it holds and waits for")
async def get_team(team: Team, caller: Caller, models: Models) -> TeamView:
    caller.require_team(team)
    record = models.teams.get(team)
    if record is None:
        raise not_found(f"team {team}")
    return team_view(record, models)


def _policy_view(team: str, models: ReadModels) -> TeamPolicyView:
    if team not in models.teams:
        raise not_found(f"team {team}")
    policy = models.tenancy.policy_of(team)
    allowed = sorted(name for name in PRIORITY_CLASSES if policy.may_use(name))
    return TeamPolicyView(
        team=team,
        allowed_priority_classes=allowed,
        non_preemptible_allowed=policy.non_preemptible_allowed,
        max_pending_jobs=policy.max_pending_jobs,
        submissions_per_second=policy.submissions_per_second,
        jobs_per_second=policy.jobs_per_second,
        pending_jobs=max(0, models.waiting_by_team[team]),
    )


@router.put(
    "/policy",
    operation_id="configureTeamPolicy",
    summary="Set what the team may ask for: classes, non-preemptible jobs, pending and rate caps",
)
async def configure_policy(
    team: Team, body: TeamPolicyBody, admin: Admin, context: Context
) -> TeamPolicyView:
    await context.commands.configure_policy(team, body)
    return _policy_view(team, context.models)


@router.get("/policy", operation_id="getTeamPolicy", summary="The team's policy and usage of it")
async def get_policy(team: Team, caller: Caller, models: Models) -> TeamPolicyView:
    caller.require_team(team)
    return _policy_view(team, models)


@router.post(
    "/tokens",
    operation_id="createTeamToken",
    status_code=status.HTTP_201_CREATED,
    summary="Issue a further named token of the team; the token is returned once",
)
async def create_token(
    team: Team, body: TokenCreate, caller: Caller, context: Context
) -> TokenCreatedView:
    await command_turn(caller, context)
    token_id, token = await context.commands.issue_token(caller, team, body.name)
    return TokenCreatedView(id=token_id, name=body.name, token=token)


@router.get(
    "/tokens", operation_id="listTeamTokens", summary="The team's tokens (never the tokens)"
)
async def list_tokens(team: Team, caller: Caller, context: Context, models: Models) -> TokenList:
    tokens = context.commands.tokens(caller, team)
    return TokenList(items=[TokenView(id=t.id, name=t.name, revoked=t.revoked) for t in tokens])


@router.delete(
    "/tokens/{token_id}",
    operation_id="revokeTeamToken",
    status_code=NO_CONTENT,
    response_class=Response,
    summary="Revoke a token: it stops working at once, in every API process",
)
async def revoke_token(team: Team, token_id: TokenId, caller: Caller, context: Context) -> None:
    await command_turn(caller, context)
    await context.commands.revoke_token(caller, team, token_id)


@router.put(
    "/secrets/{name}",
    operation_id="setTeamSecret",
    summary="Set a secret; jobs refer to it by name in secret_env, the value is never shown",
)
async def set_secret(
    team: Team, name: SecretName, body: SecretBody, caller: Caller, context: Context
) -> SecretView:
    await command_turn(caller, context)
    await context.commands.set_secret(caller, team, name, body.value)
    return SecretView(team=team, name=name)


@router.get("/secrets", operation_id="listTeamSecrets", summary="The names of the team's secrets")
async def list_secrets(team: Team, caller: Caller, context: Context, models: Models) -> SecretList:
    return SecretList(items=context.commands.secrets(caller, team))


@router.delete(
    "/secrets/{name}",
    operation_id="deleteTeamSecret",
    status_code=NO_CONTENT,
    response_class=Response,
    summary="Delete a secret: jobs can no longer refer to it",
)
async def delete_secret(team: Team, name: SecretName, caller: Caller, context: Context) -> None:
    await command_turn(caller, context)
    await context.commands.delete_secret(caller, team, name)


@router.delete(
    "/key",
    operation_id="deleteTeamKey",
    status_code=NO_CONTENT,
    response_class=Response,
    summary="Destroy the team's key: every secret it ever set is forgotten, old events too",
)
async def delete_key(team: Team, admin: Admin, context: Context) -> None:
    await context.commands.delete_team_key(team)
