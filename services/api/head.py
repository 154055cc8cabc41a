"""`HEAD` answered like `GET`, without the body (RFC 9110 9.3.2).

FastAPI's routes register only the methods they declare (Starlette's plain routes add `HEAD`
to a `GET`, FastAPI's do not), so a `HEAD` on any read answered 405. Rather than declare it on
every route, a `HEAD` is handed to the app as the `GET` it mirrors: the same authentication,
rate limits, status and headers (`Content-Length` included), and the body dropped on the way
out. A streamed answer (a followed log, the dashboard's events) is told the client left once
its headers are out, so that a `HEAD` never holds a stream open.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send


async def head_as_get(app: ASGIApp, scope: Scope, receive: Receive, send: Send) -> None:
    """Serve the `HEAD` request `scope` by `app`'s `GET`, sending only the answer's head."""
    started = False
    finished = False

    async def headless(message: Message) -> None:
        nonlocal started, finished
        if message["type"] == "http.response.start":
            started = True
            await send(message)
        elif message["type"] == "http.response.body":
            if not finished:
                finished = True
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        else:
            await send(message)

    async def until_answered() -> Message:
        if started:
            return {"type": "http.disconnect"}
        return await receive()

    await app({**scope, "method": "GET"}, until_answered, headless)
