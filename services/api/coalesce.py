"""An answer's head and body in one write to the socket.

uvicorn writes an answer in two `transport.write` calls: the status line and headers when the
app sends `http.response.start`, the body when it sends `http.response.body`. The socket
transport sends each at once (a `send` system call each, and with TCP_NODELAY a TCP segment
each), so a client that reads the head first wakes twice per answer. Here the server's
protocol gets a transport that holds what is written during one turn of the event loop and
hands it on in one `write` at the next turn (asyncio's `call_soon`): the head and body of an
answer sent in one go leave together, and what reaches 64 KiB goes on at once. The bytes on
the wire and their order are unchanged; closing the connection hands on what is held first
(an abort drops it, as the socket transport's abort drops its buffer).
"""

from __future__ import annotations

import asyncio
from typing import Any

from services.runtime.request_head import BoundedHeadProtocol

# What is held is handed on at once from this size: asyncio's default high-water mark of a
# socket transport's buffer (64 KiB), so a streamed answer still meets its flow control.
HAND_ON_BYTES = 64 * 1024


class CoalescingTransport(asyncio.Transport):
    """Forwards to `transport`, joining the writes of one event-loop turn into one."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self._transport = transport
        self._loop = loop
        self._held: list[bytes] = []
        self._held_bytes = 0

    def write(self, data: bytes | bytearray | memoryview[Any]) -> None:
        if not data:
            return
        if not self._held:
            self._loop.call_soon(self.flush)
        data = bytes(data)
        self._held.append(data)
        self._held_bytes += len(data)
        if self._held_bytes >= HAND_ON_BYTES:
            # A large answer goes on at once, so that the socket transport's flow control
            # (pause_writing past its high-water mark) acts on it as before.
            self.flush()

    def writelines(self, list_of_data: Any) -> None:
        for data in list_of_data:
            self.write(data)

    def flush(self) -> None:
        """Hand on what is held (nothing when it was handed on already)."""
        if not self._held:
            return
        held, self._held, self._held_bytes = self._held, [], 0
        self._transport.write(held[0] if len(held) == 1 else b"".join(held))

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    def can_write_eof(self) -> bool:
        return self._transport.can_write_eof()

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def abort(self) -> None:
        self._held, self._held_bytes = [], 0
        self._transport.abort()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._transport.get_extra_info(name, default)

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._transport.set_protocol(protocol)

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._transport.get_protocol()

    def pause_reading(self) -> None:
        self._transport.pause_reading()

    def resume_reading(self) -> None:
        self._transport.resume_reading()

    def is_reading(self) -> bool:
        return self._transport.is_reading()

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + self._held_bytes

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._transport.get_write_buffer_limits()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._transport.set_write_buffer_limits(high, low)


class CoalescingHttpToolsProtocol(BoundedHeadProtocol):
    """The services' bounded-head httptools protocol on a `CoalescingTransport`."""

    def connection_made(  # type: ignore[override]
        self, transport: asyncio.Transport
    ) -> None:
        super().connection_made(CoalescingTransport(transport, self.loop))
