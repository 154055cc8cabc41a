"""The API's server writes an answer's head and body to the socket in one write
(services/api/coalesce.py), with the same bytes in the same order."""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.types import Receive, Scope, Send
from uvicorn.server import ServerState

from services.api.coalesce import HAND_ON_BYTES, CoalescingTransport
from services.api.workers import server_config

REQUEST = b"POST /v1/jobs HTTP/1.1\r\nHost: api\r\nContent-Length: 2\r\n\r\n{}"


class Socket(asyncio.Transport):
    """A socket transport that records each write it is handed."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.closed = False
        self.aborted = False

    def write(self, data: Any) -> None:
        self.writes.append(bytes(data))

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.aborted = True

    def is_closing(self) -> bool:
        return self.closed or self.aborted

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 50000), "sockname": ("127.0.0.1", 8080)}.get(
            name, default
        )

    def get_write_buffer_size(self) -> int:
        return 0

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


async def created(scope: Scope, receive: Receive, send: Send) -> None:
    await receive()
    body = b'{"id":"abc","state":"pending"}'
    await send(
        {
            "type": "http.response.start",
            "status": 201,
            "headers": [
                (b"content-length", str(len(body)).encode()),
                (b"content-type", b"application/json"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def answer(requests: bytes) -> Socket:
    """What the API's server protocol writes to a socket for `requests`."""
    config = server_config(created)
    config.load()
    protocol = config.http_protocol_class(  # type: ignore[call-arg]
        config=config, server_state=ServerState(), app_state={}
    )
    socket = Socket()
    protocol.connection_made(socket)
    protocol.data_received(requests)
    for _ in range(20):  # the app's task, then the write handed on at the next turn
        await asyncio.sleep(0)
    protocol.connection_lost(None)
    return socket


async def test_an_answer_leaves_in_one_write_head_and_body_together() -> None:
    socket = await answer(REQUEST)
    [written] = socket.writes
    head, _, body = written.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 201 Created\r\n")
    assert b"content-length: 30" in head
    assert body == b'{"id":"abc","state":"pending"}'


async def test_pipelined_requests_are_answered_in_order() -> None:
    socket = await answer(REQUEST + REQUEST)
    assert b"".join(socket.writes).count(b"HTTP/1.1 201 Created") == 2
    assert b"".join(socket.writes).endswith(b'{"id":"abc","state":"pending"}')


async def test_writes_of_one_turn_are_joined_and_those_of_the_next_turn_follow() -> None:
    socket = Socket()
    transport = CoalescingTransport(socket, asyncio.get_running_loop())
    transport.write(b"head ")
    transport.write(bytearray(b"body"))
    transport.write(b"")
    assert socket.writes == []
    assert transport.get_write_buffer_size() == 9
    await asyncio.sleep(0)
    assert socket.writes == [b"head body"]
    transport.write(b"next")
    await asyncio.sleep(0)
    assert socket.writes == [b"head body", b"next"]


async def test_closing_hands_on_what_is_held_first_and_aborting_drops_it() -> None:
    socket = Socket()
    transport = CoalescingTransport(socket, asyncio.get_running_loop())
    transport.write(b"last words")
    transport.close()
    assert socket.writes == [b"last words"] and socket.closed
    await asyncio.sleep(0)
    assert socket.writes == [b"last words"]  # handed on once

    socket = Socket()
    transport = CoalescingTransport(socket, asyncio.get_running_loop())
    transport.write(b"never sent")
    transport.abort()
    await asyncio.sleep(0)
    assert socket.writes == [] and socket.aborted


async def test_a_large_answer_goes_on_at_once_to_meet_the_socket_s_flow_control() -> None:
    socket = Socket()
    transport = CoalescingTransport(socket, asyncio.get_running_loop())
    transport.write(b"head ")
    transport.write(b"x" * HAND_ON_BYTES)
    assert socket.writes == [b"head " + b"x" * HAND_ON_BYTES]  # before the turn ends
    transport.write(b"tail")
    await asyncio.sleep(0)
    assert socket.writes[1:] == [b"tail"]
