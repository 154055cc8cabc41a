"""The API's routes: who calls is known before the body is read.

FastAPI reads and parses a request's body before it resolves the route's dependencies, so a
caller without a token, or a team's token on an admin route, was told what was wrong with its
body (a 400 or a 422 naming the fields) before its 401 or 403; and the API parsed and validated
bodies for anyone. Here a route with a body whose dependencies ask for the caller resolves the
caller first; the dependencies then find it resolved (services/api/deps.py)."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from fastapi.dependencies.models import Dependant
from starlette.requests import Request
from starlette.responses import Response

from services.api.deps import caller_of, get_admin, get_principal
from services.api.strict import StrictJsonRoute


def _asks_for(dependant: Dependant, call: Callable[..., Any]) -> bool:
    return any(sub.call is call or _asks_for(sub, call) for sub in dependant.dependencies)


class ApiRoute(StrictJsonRoute):
    """A strictly read JSON route (services/api/strict.py) that knows its caller first."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        if self.body_field is None or not _asks_for(self.dependant, get_principal):
            return handler
        admin_only = _asks_for(self.dependant, get_admin)

        async def caller_first(request: Request) -> Response:
            # Its 401, 403, 429 or 503 before any word on the body.
            caller = await caller_of(request)
            if admin_only:
                caller.require_admin()
            return await handler(request)

        return caller_first
