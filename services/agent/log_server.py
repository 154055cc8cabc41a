"""The agent's log endpoint: its ranks' output, to the API only.

`GET /v1/logs/{job}/{attempt}/{rank}?offset=&tail=&limit=` returns up to `limit` bytes of a
rank's log from `offset` (or from where its last `tail` lines begin), with `X-Gangway-Offset`
(where the bytes start) and `X-Gangway-Ended` (whether no rank of that attempt still runs
here). Tenant checks stay in the API; the agent answers only requests signed with the key the
services share (GANGWAY_BUS_KEY, which ranks, running as other users, cannot read): an HMAC of
method, path with query, and an expiry a minute ahead. It binds loopback by default
(GANGWAY_LOG_HOST, GANGWAY_LOG_PORT; 0: any free port).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import socket
import time
from collections.abc import Callable, Generator
from pathlib import Path

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from services.agent import logs
from services.runtime.request_head import BoundedHeadProtocol

AUTH_HEADER = "X-Gangway-Agent-Auth"
# How long a signed request stays valid.
VALIDITY_S = 60
_ID_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-")
_MAX_READ = 1 << 20


def request_signature(key: bytes, method: str, target: str, expires: int) -> str:
    """`target` is the path with its query string, exactly as sent."""
    message = f"{method.upper()}\n{target}\n{expires}".encode()
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def auth_header(key: bytes, method: str, target: str, now: float | None = None) -> str:
    expires = int((time.time() if now is None else now) + VALIDITY_S)
    return f"{expires}:{request_signature(key, method, target, expires)}"


def authorized(key: bytes, method: str, target: str, given: str | None, now: float) -> bool:
    if not given or ":" not in given:
        return False
    expires_text, _, mac = given.partition(":")
    if not expires_text.isdigit():
        return False
    expires = int(expires_text)
    if expires < now or expires > now + 2 * VALIDITY_S:
        return False
    return hmac.compare_digest(mac, request_signature(key, method, target, expires))


def _target(request: Request) -> str:
    query = request.url.query
    return request.url.path + (f"?{query}" if query else "")


def _int(value: str | None, default: int, maximum: int = 1 << 62) -> int | None:
    """A non-negative integer parameter; None when malformed."""
    if value is None:
        return default
    if not value.isdigit() or len(value) > 19:
        return None
    return min(int(value), maximum)


def create_app(root: Path, key: bytes, running: Callable[[str, int], bool]) -> Starlette:
    def refused(request: Request) -> Response | None:
        given = request.headers.get(AUTH_HEADER)
        if not authorized(key, request.method, _target(request), given, time.time()):
            return Response("not signed with the services' key\n", status_code=403)
        return None

    def job_of(request: Request) -> str | None:
        job_id = str(request.path_params["job_id"])
        if not 1 <= len(job_id) <= 64 or not set(job_id) <= _ID_CHARS or job_id in {".", ".."}:
            return None
        return job_id

    async def read_log(request: Request) -> Response:
        if (denied := refused(request)) is not None:
            return denied
        job_id = job_of(request)
        attempt = _int(request.path_params["attempt"], 0)
        rank = _int(request.path_params["rank"], 0)
        offset = _int(request.query_params.get("offset"), 0)
        limit = _int(request.query_params.get("limit"), _MAX_READ, _MAX_READ)
        tail_text = request.query_params.get("tail")
        tail = None if tail_text is None else _int(tail_text, 0)
        if None in (job_id, attempt, rank, offset, limit) or (
            tail_text is not None and tail is None
        ):
            return Response("bad request\n", status_code=400)
        assert job_id is not None and attempt is not None and rank is not None
        assert offset is not None and limit is not None
        source = logs.rank_log(root, job_id, attempt, rank)
        ended = not running(job_id, attempt)
        if not await asyncio.to_thread(logs.exists, source):
            return Response(
                "no such log\n", status_code=404, headers={"X-Gangway-Ended": str(ended).lower()}
            )
        if tail is not None:
            offset = await asyncio.to_thread(logs.tail_offset, source, tail)
        body = await asyncio.to_thread(logs.read_from, source, offset, limit)
        return Response(
            body,
            media_type="application/octet-stream",
            headers={"X-Gangway-Offset": str(offset), "X-Gangway-Ended": str(ended).lower()},
        )

    return Starlette(
        routes=[
            Route("/v1/logs/{job_id}/{attempt}/{rank}", read_log),
        ]
    )


class _QuietServer(uvicorn.Server):
    """Leaves the process's signals to the agent (uvicorn would take SIGTERM for itself)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


class LogServer:
    """The endpoint on a socket bound at construction, so that its URL (a test's free port) is
    known before it serves."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.socket = socket.socket(family, socket.SOCK_STREAM)
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.socket.bind((host, port))
        bound_port = self.socket.getsockname()[1]
        shown = f"[{host}]" if family == socket.AF_INET6 else host
        self.url = f"http://{shown}:{bound_port}"
        self.server: uvicorn.Server | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self, app: Starlette) -> None:
        self.server = _QuietServer(
            uvicorn.Config(
                app,
                # A rank reaches this loopback port: its request head is bounded before the
                # signature is checked (services/runtime/request_head.py).
                http=BoundedHeadProtocol,
                log_level="warning",
                access_log=False,
                lifespan="off",
            )
        )
        self._task = asyncio.create_task(self.server.serve(sockets=[self.socket]))
        while not self.server.started:
            if self._task.done():
                await self._task
                raise RuntimeError("the agent's log server stopped at start")
            await asyncio.sleep(0.01)

    async def stop(self) -> None:
        if self.server is not None:
            self.server.should_exit = True
        if self._task is not None:
            await self._task
        self.socket.close()
