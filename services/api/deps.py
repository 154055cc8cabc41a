"""The dependencies routes declare: the wired context, fresh read models, the caller."""

from __future__ import annotations

import logging
from typing import Annotated

import asyncpg
from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.types import Scope

from services.api.auth import Principal, authenticate
from services.api.auth_guard import client_key
from services.api.bootstrap import ApiBootstrap, ApiContext
from services.api.problems import ProblemError
from services.api.projections.model import ReadModels
from services.api.ratelimit import READ_ANSWER_BYTES, rate_limited

log = logging.getLogger(__name__)

_UNAVAILABLE = (OSError, asyncpg.PostgresError, asyncpg.InterfaceError)


def unavailable(detail: str) -> ProblemError:
    return ProblemError(503, "unavailable", detail, headers={"Retry-After": "5"})


async def get_context(request: Request) -> ApiContext:
    bootstrap: ApiBootstrap = request.app.state.bootstrap
    try:
        return await bootstrap.context()
    except _UNAVAILABLE as error:
        log.warning("event log unreachable: %r", error)
        raise unavailable("the event log is unreachable") from error


Context = Annotated[ApiContext, Depends(get_context)]


async def get_models(context: Context) -> ReadModels:
    try:
        return await context.fresh()
    except _UNAVAILABLE as error:
        log.warning("event log unreachable: %r", error)
        raise unavailable("the event log is unreachable") from error


Models = Annotated[ReadModels, Depends(get_models)]

_bearer = HTTPBearer(
    auto_error=False,
    description="The admin token (.gangway/admin.token) or a team's token (POST /v1/teams).",
)


# Where a request's caller is kept once known (its ASGI scope): a route with a body asks who
# calls before it reads the body (services/api/routing.py), and its dependencies ask again.
PRINCIPAL_KEY = "gangway.principal"


async def get_principal(
    context: Context,
    models: Models,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
    request: Request,
) -> Principal:
    known: Principal | None = request.scope.get(PRINCIPAL_KEY)
    if known is not None:
        return known
    header = request.headers.get("authorization")
    if credentials is not None:
        header = f"Bearer {credentials.credentials}"
    try:
        principal = await authenticate(
            header,
            context.admin_sha256,
            context.store.pool,
            context.auth_guard,
            client_of(request.scope),
        )
    except _UNAVAILABLE as error:
        log.warning("event log unreachable: %r", error)
        raise unavailable("the event log is unreachable") from error
    if principal.team is not None and request.method in _READS:
        # Per team, not per token: a team may mint tokens of its own (POST .../tokens).
        rate = context.settings.team_reads_per_second
        wait = context.reads.take(principal.team, rate)
        if wait is not None:
            raise rate_limited(f"team {principal.team!r} may read {rate:g} times per second", wait)
    if request.method in _READS:
        # After the caller is known: a refused or rate-limited read asks nothing of the log.
        await context.read_barrier()
    request.scope[PRINCIPAL_KEY] = principal
    return principal


async def caller_of(request: Request) -> Principal:
    """The request's caller, resolved as the `Caller` dependency resolves it (and kept)."""
    context = await get_context(request)
    models = await get_models(context)
    return await get_principal(context, models, await _bearer(request), request)


_READS = frozenset({"GET", "HEAD"})


def client_of(scope: Scope) -> str:
    """Whom the request's failed token look-ups count against (services/api/auth_guard.py):
    the peer's address as the socket gives it (the API trusts no forwarding header). From the
    ASGI scope, as `Request.client` reads it, without building a Request for it."""
    client = scope.get("client")
    return client_key(client[0] if client is not None else None)


Caller = Annotated[Principal, Depends(get_principal)]


async def still_authorized(request: Request, context: ApiContext) -> bool:
    """Whether the request's token is still good: a stream that outlives its first check
    (the dashboard's, a followed log) asks again before it shows anything new, so that a
    revoked token stops seeing the team's jobs. An unreachable log ends the stream too."""
    try:
        await authenticate(
            request.headers.get("authorization"),
            context.admin_sha256,
            context.store.pool,
            context.auth_guard,
            client_of(request.scope),
        )
    except (ProblemError, *_UNAVAILABLE):
        return False
    return True


async def get_admin(caller: Caller) -> Principal:
    caller.require_admin()
    return caller


Admin = Annotated[Principal, Depends(get_admin)]


async def command_turn(caller: Principal, context: ApiContext) -> None:
    """429 when the caller's team is past its rate of commands (hold, release, PATCH, cancel,
    suspend, resume of a job or a whole array; a token issued or revoked, a secret set or
    deleted): each may append to the log every team shares, and toggling back and forth has no
    other bound. A bucket per team shared by every API process (services/api/ratelimit.py);
    the admin is not bounded."""
    if caller.team is None:
        return
    rate = context.settings.team_commands_per_second
    wait = await context.commands.limiter.take(f"commands:{caller.team}", rate)
    if wait is not None:
        raise rate_limited(f"team {caller.team!r} may make {rate:g} changes per second", wait)


def answer_weighed(caller: Principal, context: ApiContext, weight: int, *, read: bool) -> None:
    """Charge the caller's team one read per READ_ANSWER_BYTES of the job specs its answer is
    about to carry (`weight`, routers/jobs.spec_bytes), beyond the one a read took already:
    an array's view or a listing page repeats specs of up to a mebibyte, built in the event
    loop every team shares, which a count of reads alone did not bound. A read (`read`) while
    the team is in debt for earlier heavy answers is 429 before it is built; the answer to a
    change already made is paid for all the same. The admin is not bounded."""
    if caller.team is None:
        return
    cost = weight // READ_ANSWER_BYTES - (1 if read else 0)
    if cost <= 0:
        return
    rate = context.settings.team_reads_per_second
    wait = context.reads.charge(caller.team, rate, cost, refusable=read)
    if wait is not None:
        raise rate_limited(
            f"team {caller.team!r} may read {rate:g} times per second, an answer counting "
            f"once per {READ_ANSWER_BYTES} bytes of the job specs it carries",
            wait,
        )
