"""RFC 9457 problem details: the one shape of every error the API returns."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from schemas.jobs import NAME_PATTERN
from services.runtime.errors import DATABASE_UNAVAILABLE

log = logging.getLogger(__name__)

PROBLEM_MEDIA_TYPE = "application/problem+json"
PROBLEM_BASE = "https://gangway.dev/problems/"
# How long a client should wait before retrying a request refused while PostgreSQL is away.
RETRY_AFTER_S = 5


class FieldError(BaseModel):
    loc: list[str | int]
    msg: str
    type: str


class Problem(BaseModel):
    type: str
    title: str
    status: int
    detail: str | None = None
    instance: str | None = None
    errors: list[FieldError] | None = None


class ProblemError(HTTPException):
    """Raised by routes and dependencies for an error the client can act upon.

    An HTTPException, so that one raised while FastAPI reads a body (strict.py) keeps its own
    status and slug instead of becoming a generic 400.
    """

    def __init__(
        self,
        status: int,
        slug: str,
        detail: str,
        *,
        headers: dict[str, str] | None = None,
        errors: Sequence[FieldError] | None = None,
    ) -> None:
        super().__init__(status, detail, headers)
        self.status = status
        self.slug = slug
        self.detail = detail
        self.errors = errors


def not_found(what: str) -> ProblemError:
    return ProblemError(404, "not-found", f"{what} not found")


def conflict(detail: str) -> ProblemError:
    return ProblemError(409, "conflict", detail)


def forbidden(detail: str) -> ProblemError:
    return ProblemError(403, "forbidden", detail)


def unauthorized(detail: str) -> ProblemError:
    return ProblemError(
        401, "unauthorized", detail, headers={"WWW-Authenticate": 'Bearer realm="gangway"'}
    )


def problem_response(
    request: Request,
    status: int,
    slug: str,
    detail: str | None,
    *,
    errors: Sequence[FieldError] | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    problem = Problem(
        type=PROBLEM_BASE + slug,
        title=_title(status),
        status=status,
        detail=detail,
        instance=request.url.path,
        errors=list(errors) if errors is not None else None,
    )
    return JSONResponse(
        problem.model_dump(exclude_none=True),
        status_code=status,
        media_type=PROBLEM_MEDIA_TYPE,
        headers=headers,
    )


def _title(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Error"


_SLUGS = {
    400: "bad-request",
    401: "unauthorized",
    403: "forbidden",
    404: "not-found",
    405: "method-not-allowed",
    408: "request-timeout",
    409: "conflict",
    413: "payload-too-large",
    415: "unsupported-media-type",
    422: "validation-error",
    429: "too-many-requests",
}


def field_errors(items: Sequence[Any]) -> list[FieldError]:
    """Pydantic's (or FastAPI's) error items as the problem's `errors`."""
    found: list[FieldError] = []
    for item in items:
        loc = [part if isinstance(part, int) else str(part) for part in item.get("loc", ())]
        found.append(FieldError(loc=loc, msg=_message(item), type=str(item.get("type"))))
    return found


def _message(item: Any) -> str:
    """The item's message; a name's pattern in words. `name: my job` read "String should match
    pattern '^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$'", a regular expression for a newcomer."""
    context = item.get("ctx") or {}
    if item.get("type") == "string_pattern_mismatch" and context.get("pattern") == NAME_PATTERN:
        given = item.get("input")
        shown = f"{given[:64]!r} is not a name: " if isinstance(given, str) else ""
        return f"{shown}{NAME_RULE}"
    if item.get("type") == "model_type" and context.get("class_name") == "Dependency":
        # `depends_on: [prep]` read "Input should be a valid dictionary or instance of
        # Dependency", a class name the user never wrote.
        given = item.get("input")
        shown = f"{given!r:.64} is not a dependency: " if isinstance(given, str) else ""
        return f"{shown}{DEPENDENCY_RULE}"
    message = str(item.get("msg", ""))
    if item.get("type") == "value_error":
        # Pydantic's prefix to a validator's own words: "Value error, min_tasks must not …".
        message = message.removeprefix("Value error, ")
    return message


NAME_RULE = "1 to 63 letters, digits, '.', '_' or '-', the first a letter or digit"
DEPENDENCY_RULE = (
    "each entry is {job: <job id, or the name of a job of the same request>, "
    "condition: succeeded | finished | failed}"
)


async def _on_problem(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ProblemError)
    return problem_response(
        request,
        exc.status,
        exc.slug,
        exc.detail,
        headers=None if exc.headers is None else dict(exc.headers),
        errors=exc.errors,
    )


async def _on_http(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    slug = _SLUGS.get(exc.status_code, "error")
    detail = exc.detail if isinstance(exc.detail, str) else None
    headers = dict(exc.headers) if exc.headers else None
    allowed = _allowed(request) if exc.status_code == 405 else []
    if allowed:
        # Starlette names the methods of the one route it matched (GET for /v1/jobs/{id});
        # RFC 9110 wants every method the resource has (PATCH too).
        headers = {**(headers or {}), "Allow": ", ".join(allowed)}
    return problem_response(request, exc.status_code, slug, detail, headers=headers)


def _allowed(request: Request) -> list[str]:
    """Every method some route serves at the request's path."""
    routes = request.app.router.routes
    methods = {
        method
        for method in _METHODS
        if any(
            route.matches({**request.scope, "method": method})[0] == Match.FULL for route in routes
        )
    }
    if "GET" in methods:
        methods.add("HEAD")  # answered as its GET (head.py)
    return sorted(methods)


_METHODS = ("DELETE", "GET", "PATCH", "POST", "PUT")


async def _on_validation(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = field_errors(exc.errors())
    # A body that is not JSON at all is a malformed request, not an invalid job spec.
    if any(error.type == "json_invalid" for error in errors):
        return problem_response(
            request, 400, "malformed-json", "the request body is not valid JSON", errors=errors
        )
    return problem_response(request, 422, "validation-error", summarize(errors), errors=errors)


_unavailable_logged_at = 0.0


async def _on_unavailable(request: Request, exc: Exception) -> JSONResponse:
    # The write was not acknowledged: it committed whole or not at all, and a retry with the
    # same Idempotency-Key finds the job if it did. One log line per 10 s, not per request.
    global _unavailable_logged_at
    now = time.monotonic()
    if now - _unavailable_logged_at >= 10.0:
        _unavailable_logged_at = now
        log.warning(
            "the event log is unreachable (%s %s): %r", request.method, request.url.path, exc
        )
    return problem_response(
        request,
        503,
        "unavailable",
        "the event log is unreachable; retry later",
        headers={"Retry-After": str(RETRY_AFTER_S)},
    )


async def _on_unexpected(request: Request, exc: Exception) -> JSONResponse:
    # The traceback goes to the log, never to the client.
    log.exception("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    return problem_response(request, 500, "internal-error", "an unexpected error occurred")


async def problem_for(request: Request, exc: Exception) -> JSONResponse:
    """The answer the app's handlers (installed below) give for `exc`, for a route served
    outside the framework (fast_submit.py)."""
    if isinstance(exc, ProblemError):
        return await _on_problem(request, exc)
    if isinstance(exc, DATABASE_UNAVAILABLE):
        return await _on_unavailable(request, exc)
    if isinstance(exc, StarletteHTTPException):
        return await _on_http(request, exc)
    return await _on_unexpected(request, exc)


def install_problem_handlers(app: FastAPI) -> None:
    app.add_exception_handler(ProblemError, _on_problem)
    app.add_exception_handler(StarletteHTTPException, _on_http)
    app.add_exception_handler(RequestValidationError, _on_validation)
    for unavailable in DATABASE_UNAVAILABLE:
        app.add_exception_handler(unavailable, _on_unavailable)
    app.add_exception_handler(Exception, _on_unexpected)


def problem_docs(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI entries for the problem responses an operation may give."""
    return {
        status: {
            "model": Problem,
            "content": {PROBLEM_MEDIA_TYPE: {}},
            "description": _title(status),
        }
        for status in statuses
    }


def summarize(errors: Sequence[FieldError]) -> str:
    return "; ".join(
        f"{'.'.join(str(part) for part in error.loc)}: {error.msg}" for error in errors[:5]
    )


PROBLEM_RESPONSES = problem_docs(400, 401, 403, 404, 408, 409, 413, 415, 422, 429, 503)
