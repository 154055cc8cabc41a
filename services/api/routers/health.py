"""Liveness, readiness and metrics: no authentication, for probes and scrapers."""

from __future__ import annotations

import ipaddress

from fastapi import APIRouter, Request, Response

from services.api.auth import bearer_token, is_admin_token
from services.api.bootstrap import ApiBootstrap
from services.api.deps import Context, unavailable
from services.api.metrics import ApiMetrics
from services.api.models import Health
from services.api.problems import problem_docs
from services.runtime.relay import log_identity, relay_status

router = APIRouter(tags=["health"])


@router.get("/healthz", operation_id="healthz", summary="The process is alive")
async def healthz() -> Health:
    return Health(status="ok")


@router.get(
    "/readyz",
    operation_id="readyz",
    summary="The log is reachable and the read models have caught up",
    responses=problem_docs(503),
)
async def readyz(context: Context) -> Health:
    try:
        head = await context.feed.refresh_head()
    except Exception as error:
        raise unavailable("the event log is unreachable") from error
    lag = context.feed.lag
    if lag > context.settings.ready_max_lag:
        raise unavailable(f"the read models trail the log by {lag} events")
    # The relay feeds every service: the API is not ready while the bus trails the log.
    relay = await relay_status(context.feed.store, context.settings.relay_name)
    if relay["lag"] > context.settings.ready_max_lag_events:
        raise unavailable(f"the relay trails the log by {relay['lag']} events")
    detail = {
        "head": head,
        "applied": context.models.watermark.position,
        "lag": lag,
        "relay": relay,
        "log": await log_identity(context.feed.store),
    }
    return Health(status="ok", detail=detail)


@router.get("/metrics", operation_id="metrics", include_in_schema=False)
async def metrics(request: Request, context: Context) -> Response:
    """Prometheus' text format. The per-team series (team names, their GPUs, waits and GPU
    time) are the operator's: shown to the admin token, and to a tokenless scrape from the API's
    own host (loopback, where the service metrics listen too: the operator's Prometheus, probes
    and tools on the host); anyone else, a team's token included, sees cluster-wide series."""
    bootstrap: ApiBootstrap = request.app.state.bootstrap
    registry: ApiMetrics = bootstrap.metrics
    header = request.headers.get("authorization")
    if header is None:
        operator = request.client is not None and _loopback(request.client.host)
    else:
        token = bearer_token(header)
        operator = token is not None and is_admin_token(token, context.admin_sha256)
    return Response(
        registry.render(operator=operator), media_type="text/plain; version=0.0.4; charset=utf-8"
    )


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a name, not an address (ASGI servers give addresses)
        return False
