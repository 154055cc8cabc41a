"""`HEAD` answered like `GET`, without the body (RFC 9110 9.3.2).

FastAPI's routes register only the methods they declare (Starlette's plain routes add `HEAD`
to a `GET`, FastAPI's do not), so a `HEAD` on any read answered 405. Rather than declare it on
every route, a `HEAD` is handed to the app as the `GET` it mirrors: the same authentication,
rate limits, status and headers (`Content-Length` included), and the body dropped on the way
out. A streamed answer (a followed log, the dashboard's events: no `Content-Length`) is
stopped once its head is out, so that a `HEAD` never holds a stream, or its team's share of
streams, open.
"""

from __future__ import annotations

import asyncio
import contextlib

from starlette.types import ASGIApp, Message, Receive, Scope, Send


async def head_as_get(app: ASGIApp, scope: Scope, receive: Receive, send: Send) -> None:
    """Serve the `HEAD` request `scope` by `app`'s `GET`, sending only the answer's head."""
    finished = asyncio.Event()
    streamed = False

    async def finish() -> None:
        if not finished.is_set():
            finished.set()
            await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def headless(message: Message) -> None:
        nonlocal streamed
        if message["type"] == "http.response.start":
            await send(message)
            headers = message.get("headers", ())
            if not any(name.lower() == b"content-length" for name, _ in headers):
                streamed = True
                await finish()  # a stream: its head is all there is to send
        elif message["type"] == "http.response.body":
            await finish()
        else:
            await send(message)

    serving = asyncio.ensure_future(app({**scope, "method": "GET"}, receive, headless))
    answered = asyncio.ensure_future(finished.wait())
    try:
        await asyncio.wait({serving, answered}, return_when=asyncio.FIRST_COMPLETED)
        if not serving.done() and streamed:
            # A stream would go on until its end (a followed log: the job's): stop it here.
            serving.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await serving
        else:
            await serving  # an ordinary answer: the app finishes (metrics, clean-up), or fails
    finally:
        answered.cancel()
        if not serving.done():
            serving.cancel()
