"""`POST /v1/jobs` and `POST /v1/jobs:batch` without the framework's machinery for ordinary
submissions.

Profiled on the submit path, FastAPI's routing, dependency solving, body handling and the eight
middleware layers around it cost about three times our own handler (and for a batch, a third
validation of every spec). An ordinary submission (a JSON body of declared length within the
cap, one bearer token; for `POST /v1/jobs` one job, no array, no dependencies) is served here
instead, through the same checks in the same order and with the same answers: authentication,
the strict JSON walk, pydantic's strict validation, then the command (`Commands.submit` or
`submit_many`: limits, rules, the append).

Anything else goes to the full app unchanged (with the body replayed, and the caller once
known): a refused token, an invalid body, an unreachable log before the command, an array or
a pipeline. Those answers so
stay exactly what the routes give, and since nothing is written before the command, a request
handed over is never half done. Errors of the command itself are answered by the app's own
problem handlers (`problem_for`).
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Awaitable, Coroutine, Generator
from typing import Any, Final

from pydantic import TypeAdapter
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from schemas.jobs import JobSpec
from services.api.auth import Principal, authenticate
from services.api.bootstrap import ApiBootstrap, ApiContext
from services.api.deps import PRINCIPAL_KEY, client_of
from services.api.limits import forward_read_body
from services.api.metrics import ApiMetrics
from services.api.models import BatchCreatedView, BatchSubmit, JobCreatedView
from services.api.problems import problem_for
from services.api.strict import parse_strict_json
from services.api.timeouts import answer_request_timeout

SINGLE: Final = "/v1/jobs"
BATCH: Final = "/v1/jobs:batch"
_SPEC: Final = TypeAdapter(JobSpec)
_BATCH: Final = TypeAdapter(BatchSubmit)
# Counted as nginx does a client that left before its answer (nothing is sent).
CLIENT_LEFT: Final = 499
# The route's Idempotency-Key header: 1 to 255 visible ASCII characters.
_KEY = re.compile(r"[\x21-\x7e]{1,255}")
_JSON_HEADERS: Final = [(b"content-type", b"application/json")]


class _Ordinary(Exception):
    """The request is not an ordinary submission: the full app answers it."""


def is_submission(scope: Scope) -> bool:
    return bool(
        scope["type"] == "http" and scope["path"] in (SINGLE, BATCH) and scope["method"] == "POST"
    )


class FastSubmit:
    """Serves ordinary submissions; hands everything else to `app` (the full stack)."""

    def __init__(
        self,
        app: ASGIApp,
        bootstrap: ApiBootstrap,
        metrics: ApiMetrics,
        *,
        max_body_bytes: int,
        body_read_timeout_s: float,
    ) -> None:
        self.app = app
        self.bootstrap = bootstrap
        self.metrics = metrics
        self.max_body_bytes = max_body_bytes
        self.timeout_s = body_read_timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = _headers(scope)
        if headers is None or headers[0] > self.max_body_bytes:
            await self.app(scope, receive, send)  # not ordinary, or the body cap's 413 unread
            return
        started = time.perf_counter()
        status = await self._serve(scope, receive, send, headers[1], headers[2])
        if status is not None:  # else the full app answered and counted it
            self.metrics.observe("POST", scope["path"], status, time.perf_counter() - started)

    async def _serve(
        self, scope: Scope, receive: Receive, send: Send, authorization: str | None, key: str | None
    ) -> int | None:
        read = await self._body(scope, receive, send)
        if isinstance(read, int):
            return read
        try:
            return await self._submit(scope, send, read, authorization, key)
        except _Ordinary:
            pass
        await forward_read_body(self.app, scope, receive, send, read)
        return None

    async def _body(self, scope: Scope, receive: Receive, send: Send) -> bytes | int:
        """The whole body within the deadline; else the status the request ended with: 408
        (sent here, as the app's body deadline would), or 499 when the client left."""
        deadline = asyncio.get_running_loop().time() + self.timeout_s
        # The server has the whole body of a small request before the app is called, nearly
        # always: its first message is then taken without waiting, and without the deadline's
        # timer (a timer handle scheduled and cancelled per request). A receive that must
        # wait goes on under the deadline from where it stopped.
        step = receive()
        pending: Awaitable[Message] | None = step
        if isinstance(step, Coroutine):
            try:
                waiting = step.send(None)
            except StopIteration as done:
                first: Message = done.value
                if first["type"] == "http.request" and not first.get("more_body", False):
                    return bytes(first.get("body", b""))
                pending = _Ready(first)
            else:
                pending = _Resumed(step, waiting)
        chunks: list[bytes] = []
        try:
            async with asyncio.timeout_at(deadline):
                while True:
                    message = await (receive() if pending is None else pending)
                    pending = None
                    if message["type"] == "http.disconnect":
                        return CLIENT_LEFT
                    chunks.append(message.get("body", b""))
                    if not message.get("more_body", False):
                        return b"".join(chunks)
        except TimeoutError:
            await answer_request_timeout(scope, send, self.timeout_s)
            return 408

    async def _submit(
        self, scope: Scope, send: Send, body: bytes, authorization: str | None, key: str | None
    ) -> int:
        """The answer's status; raises _Ordinary for whatever the full app must answer."""
        if len(body) > self.max_body_bytes:
            raise _Ordinary  # more than declared: the cap's 413
        # The caller first, as the routes know it (routing.py): a body is read and validated
        # only for a caller with a good token. Read first, a refused or missing token cost a
        # 1 MiB batch's parse and validation (tens of ms) before the cheap 401, for anyone.
        try:
            context = await self.bootstrap.context()
            await context.fresh()
            principal = await authenticate(
                authorization,
                context.admin_sha256,
                context.store.pool,
                context.auth_guard,
                client_of(scope),
            )
        except Exception:
            raise _Ordinary from None  # nothing written yet: the app answers as its routes do
        # Kept where the route's dependencies look for it: a request handed over from here on
        # is not looked up in the log a second time.
        scope[PRINCIPAL_KEY] = principal
        batch = scope["path"] == BATCH
        try:
            parse_strict_json(body)
            request = (_BATCH if batch else _SPEC).validate_json(body, strict=True)
        except Exception:  # malformed, refused or invalid: the route's own answer
            raise _Ordinary from None
        if isinstance(request, JobSpec) and (request.array is not None or request.depends_on):
            raise _Ordinary
        try:
            created = await _command(context, principal, request, key)
        except Exception as error:
            response = await problem_for(Request(scope), error)
            await response(scope, _disconnected, send)
            return response.status_code
        payload = created.model_dump_json(exclude_none=True).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 201,
                "headers": [(b"content-length", str(len(payload)).encode()), *_JSON_HEADERS],
            }
        )
        await send({"type": "http.response.body", "body": payload})
        return 201


async def _command(
    context: ApiContext, principal: Principal, request: JobSpec | BatchSubmit, key: str | None
) -> JobCreatedView | BatchCreatedView:
    """What the route's handler does (routers/jobs.py), and its answer's model."""
    commands = context.commands
    if isinstance(request, JobSpec):
        job = await commands.submit(principal, request, idempotency_key=key)
        return JobCreatedView(id=job.id, state=job.state)
    planned = await commands.submit_many(principal, request.jobs, idempotency_key=key)
    jobs = context.models.jobs
    return BatchCreatedView(
        jobs=[
            JobCreatedView(id=job.id, state=jobs[job.events[0].job_id].state, array=job.element_ids)
            for job in planned
        ]
    )


class _Ready:
    """An awaitable of a message already received."""

    __slots__ = ("message",)

    def __init__(self, message: Message) -> None:
        self.message = message

    def __await__(self) -> Generator[Any, Any, Message]:
        return self.message
        yield  # a generator that returns at once


class _Resumed:
    """The rest of a coroutine that was stepped once and is waiting on what it yielded: what
    the task would have done with it (hand on what it yields, send or throw back what comes)."""

    __slots__ = ("coroutine", "waiting")

    def __init__(self, coroutine: Coroutine[Any, Any, Message], waiting: Any) -> None:
        self.coroutine = coroutine
        self.waiting = waiting

    def __await__(self) -> Generator[Any, Any, Message]:
        coroutine, waiting = self.coroutine, self.waiting
        while True:
            try:
                sent = yield waiting
            except BaseException as error:  # a cancellation (the deadline's) goes in too
                try:
                    waiting = coroutine.throw(error)
                except StopIteration as done:
                    result: Message = done.value
                    return result
            else:
                try:
                    waiting = coroutine.send(sent)
                except StopIteration as done:
                    message: Message = done.value
                    return message


async def _disconnected() -> Message:
    return {"type": "http.disconnect"}


def _headers(scope: Scope) -> tuple[int, str | None, str | None] | None:
    """Content-Length, Authorization and Idempotency-Key of an ordinary submission; None when
    a header makes it anything else (no length, a second value, a body that is not JSON, a
    key the route would refuse)."""
    length: int | None = None
    authorization: str | None = None
    key: str | None = None
    json_body = False
    seen: set[bytes] = set()
    for name, value in scope["headers"]:
        if name in seen and name in _SINGLE:
            return None
        seen.add(name)
        if name == b"content-length":
            if not value.isdigit():
                return None
            length = int(value)
        elif name == b"authorization":
            authorization = value.decode("latin-1")
        elif name == b"idempotency-key":
            key = value.decode("latin-1")
            if _KEY.fullmatch(key) is None:
                return None
        elif name == b"content-type":
            media = value.split(b";", 1)[0].strip().lower()
            json_body = media == b"application/json"
        elif name == b"transfer-encoding":
            return None
    if length is None or not json_body:
        return None
    return length, authorization, key


_SINGLE: Final = frozenset(
    {b"content-length", b"authorization", b"idempotency-key", b"content-type"}
)
