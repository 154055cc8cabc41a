"""A cap on request bodies, enforced before any route parses them."""

from __future__ import annotations

from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from services.api.problems import problem_response


async def forward_read_body(
    app: ASGIApp, scope: Scope, receive: Receive, send: Send, body: bytes
) -> None:
    """Hand a request whose body was already read on to `app`: the body is replayed as one
    message, then `receive` answers as before (a disconnect, for one)."""
    replayed = False

    async def replay() -> Message:
        nonlocal replayed
        if not replayed:
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    await app(scope, replay, send)


MIB = 1024 * 1024


class BodySizeLimit:
    """Answers 413 problem+json for bodies over `max_bytes`, declared or streamed.

    The body is read here in full (it is small by construction) and replayed to the app, so a
    chunked upload without Content-Length cannot slip past the cap either.
    """

    def __init__(self, app: ASGIApp, max_bytes: int = MIB) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in {"GET", "HEAD", "OPTIONS", "DELETE"}:
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_bytes:
            await self._too_large(scope, receive, send)
            return
        chunks: list[bytes] = []
        size = 0
        more = True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await self._too_large(scope, receive, send)
                return
            chunks.append(chunk)
            more = bool(message.get("more_body", False))
        await forward_read_body(self.app, scope, receive, send, b"".join(chunks))

    async def _too_large(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        response = problem_response(
            request,
            413,
            "payload-too-large",
            f"the request body exceeds {self.max_bytes} bytes",
            headers={"Connection": "close"},
        )
        await response(scope, receive, send)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None
