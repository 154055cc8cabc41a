"""A request body is read within a deadline, or answered 408 and the connection closed.

A client that announces 100 bytes and sends 9 would otherwise hold a connection (and a
worker's attention) forever: uvicorn has no body timeout of its own.
"""

from __future__ import annotations

import asyncio

from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from services.api.problems import problem_response


class BodyReadTimeout:
    def __init__(self, app: ASGIApp, timeout_s: float) -> None:
        self.app = app
        self.timeout_s = timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        # In the event loop's (monotonic) clock, for asyncio.timeout_at.
        deadline = asyncio.get_running_loop().time() + self.timeout_s
        body_read = False
        started = False
        answered = False

        async def guarded_send(message: Message) -> None:
            nonlocal started
            if answered:
                return  # the 408 went out: whatever the app still says is dropped
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        async def bounded_receive() -> Message:
            nonlocal body_read, answered
            if body_read or answered:
                # Past the body, receiving only waits for the disconnect: no deadline.
                return await receive()
            try:
                # A timeout scope, not wait_for: no task of its own per request.
                async with asyncio.timeout_at(deadline):
                    message = await receive()
            except TimeoutError:
                if not started:
                    await self._request_timeout(scope, send)
                    answered = True
                # To the app the client is gone; it stops reading and its answer is dropped.
                return {"type": "http.disconnect"}
            if message["type"] != "http.request" or not message.get("more_body", False):
                body_read = True
            return message

        await self.app(scope, bounded_receive, guarded_send)

    async def _request_timeout(self, scope: Scope, send: Send) -> None:
        await answer_request_timeout(scope, send, self.timeout_s)


async def answer_request_timeout(scope: Scope, send: Send, timeout_s: float) -> None:
    """The 408 problem for a body not received within `timeout_s`; the connection closes."""
    response = problem_response(
        Request(scope),
        408,
        "request-timeout",
        f"the request body was not received within {timeout_s:g} s",
        headers={"Connection": "close"},
    )

    async def nothing() -> Message:
        return {"type": "http.disconnect"}

    await response(scope, nothing, send)
