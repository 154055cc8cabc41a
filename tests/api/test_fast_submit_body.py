"""How the fast submission path reads a body (services/api/fast_submit.py `_body`): a body the
server holds already is taken without arming the deadline's timer; one that must be waited for
is read under the deadline, from where its first receive stopped."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, cast

import pytest
from starlette.types import Message

from services.api.fast_submit import CLIENT_LEFT, FastSubmit

SCOPE: dict[str, Any] = {
    "type": "http",
    "method": "POST",
    "path": "/v1/jobs",
    "headers": [],
    "query_string": b"",
}


def reader(timeout_s: float = 5.0) -> FastSubmit:
    nothing = cast(Any, None)
    return FastSubmit(
        nothing, nothing, nothing, max_body_bytes=1 << 20, body_read_timeout_s=timeout_s
    )


@pytest.fixture
async def timers(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[list[float]]:
    """The times of the timers armed on the running loop during the test."""
    loop = asyncio.get_running_loop()
    armed: list[float] = []
    call_at = loop.call_at

    def counted(when: float, *args: Any, **kwargs: Any) -> asyncio.TimerHandle:
        armed.append(when)
        return call_at(when, *args, **kwargs)

    monkeypatch.setattr(loop, "call_at", counted)
    yield armed


class Sent:
    def __init__(self) -> None:
        self.messages: list[Message] = []

    async def __call__(self, message: Message) -> None:
        self.messages.append(message)


async def test_a_body_held_already_is_taken_without_a_timer(timers: list[float]) -> None:
    async def receive() -> Message:
        return {"type": "http.request", "body": b'{"a": 1}', "more_body": False}

    assert await reader()._body(SCOPE, receive, Sent()) == b'{"a": 1}'
    assert timers == []


async def test_a_body_that_must_be_waited_for_is_read_under_the_deadline(
    timers: list[float],
) -> None:
    parts = iter([b'{"a":', b" 1}"])

    async def receive() -> Message:
        await asyncio.sleep(0.01)  # the first receive stops here, and is resumed
        part = next(parts)
        return {"type": "http.request", "body": part, "more_body": part != b" 1}"}

    assert await reader()._body(SCOPE, receive, Sent()) == b'{"a": 1}'
    assert len(timers) >= 1


async def test_a_partial_body_held_already_goes_on_under_the_deadline() -> None:
    parts = iter([b"[1,", b"2]"])

    async def receive() -> Message:
        part = next(parts)
        if part == b"2]":
            await asyncio.sleep(0.01)
        return {"type": "http.request", "body": part, "more_body": part == b"[1,"}

    assert await reader()._body(SCOPE, receive, Sent()) == b"[1,2]"


async def test_a_body_that_does_not_come_is_answered_408_at_the_deadline() -> None:
    async def receive() -> Message:
        await asyncio.Event().wait()  # never
        raise AssertionError

    send = Sent()
    assert await reader(0.05)._body(SCOPE, receive, send) == 408
    assert send.messages[0]["status"] == 408


async def test_a_client_that_left_is_counted_so() -> None:
    async def gone() -> Message:
        return {"type": "http.disconnect"}

    assert await reader()._body(SCOPE, gone, Sent()) == CLIENT_LEFT

    async def gone_later() -> Message:
        await asyncio.sleep(0.01)
        return {"type": "http.disconnect"}

    assert await reader()._body(SCOPE, gone_later, Sent()) == CLIENT_LEFT
