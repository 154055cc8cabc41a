"""The FastAPI application: routers, problem handlers, body cap, metrics, lifespan."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from starlette.types import Receive, Scope, Send

from services.api.bootstrap import ApiBootstrap
from services.api.fast_submit import FastSubmit, is_submission
from services.api.head import head_as_get
from services.api.limits import BodySizeLimit
from services.api.metrics import ApiMetrics, RequestMetrics
from services.api.problems import install_problem_handlers
from services.api.routers import (
    admin,
    dashboard,
    events,
    health,
    inventory,
    jobs,
    logs,
    teams,
    usage,
)
from services.api.settings import ApiSettings
from services.api.timeouts import BodyReadTimeout
from services.runtime.collector import settle_started_service

DESCRIPTION = """\
Gangway's REST API: submit and control jobs, read the cluster, audit the log.

Authenticate with `Authorization: Bearer <token>` (the admin token, or a team's token).
Every error is an RFC 9457 problem (`application/problem+json`).
"""


class GangwayApi(FastAPI):
    """FastAPI, with ordinary submissions served before its middleware (fast_submit.py), and
    `HEAD` served as `GET` without the body (head.py)."""

    fast_submit: FastSubmit | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.fast_submit is not None and is_submission(scope):
            await self.fast_submit(scope, receive, send)
        elif scope["type"] == "http" and scope["method"] == "HEAD":
            await head_as_get(super().__call__, scope, receive, send)
        else:
            await super().__call__(scope, receive, send)


def create_app(
    settings: ApiSettings | None = None, *, use_bus: bool = True, settle: bool = False
) -> GangwayApi:
    """The app for `settings`; its lifespan rebuilds the read models and keeps them fed.

    Without a lifespan (an ASGI transport in tests) the first request wires it lazily. With
    `settle` (a server process of its own), what the rebuild made is kept out of the garbage
    collector's scans once it is done (runtime/collector.py).
    """
    resolved = settings or ApiSettings()
    metrics = ApiMetrics()
    bootstrap = ApiBootstrap(resolved, metrics)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await bootstrap.start(use_bus=use_bus)
        if settle:
            settle_started_service()
        try:
            yield
        finally:
            await bootstrap.close()

    app = GangwayApi(
        title="Gangway",
        version="1.0.0",
        description=DESCRIPTION,
        lifespan=lifespan,
        docs_url="/docs",
        openapi_url="/openapi.json",
    )
    app.state.bootstrap = bootstrap
    install_problem_handlers(app)
    for module in (jobs, events, inventory, admin, teams, health):
        app.include_router(module.router)
    for module in (logs, usage, dashboard):  # issue 13: the operators' and users' views
        app.include_router(module.router)
    # The last added is outermost: metrics see every answer, the body cap's 413 and the
    # body deadline's 408 included.
    app.add_middleware(BodySizeLimit, max_bytes=resolved.max_body_bytes)
    app.add_middleware(BodyReadTimeout, timeout_s=resolved.body_read_timeout_s)
    app.add_middleware(RequestMetrics, metrics=metrics)
    app.fast_submit = FastSubmit(
        super(GangwayApi, app).__call__,
        bootstrap,
        metrics,
        max_body_bytes=resolved.max_body_bytes,
        body_read_timeout_s=resolved.body_read_timeout_s,
    )
    return app
