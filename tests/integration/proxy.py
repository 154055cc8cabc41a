"""A loopback TCP proxy a test can cut: the database (or broker) goes away for real, from the
client's side, without stopping the shared server."""

from __future__ import annotations

import asyncio
import contextlib
from urllib.parse import urlsplit, urlunsplit


class TcpProxy:
    """Forwards 127.0.0.1:<port> to `target`; `cut()` closes every connection and refuses new
    ones (as a stopped server does); `restore()` accepts again. `stall()` keeps every
    connection open but delivers nothing either way (a silent partition, a host that froze:
    no reset ever comes); `heal()` delivers what was held, as TCP's retransmissions would."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.port = 0
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._flowing = asyncio.Event()
        self._flowing.set()

    def stall(self) -> None:
        self._flowing.clear()

    def heal(self) -> None:
        self._flowing.set()

    @classmethod
    async def for_dsn(cls, dsn: str) -> tuple[TcpProxy, str]:
        """A started proxy in front of the server of `dsn`, and the DSN that goes through it."""
        parts = urlsplit(dsn)
        proxy = cls(parts.hostname or "127.0.0.1", parts.port or 5432)
        await proxy.restore()
        netloc = parts.netloc.rsplit(":", 1)[0] if parts.port else parts.netloc
        return proxy, urlunsplit(parts._replace(netloc=f"{netloc}:{proxy.port}"))

    async def restore(self) -> None:
        if self._server is None:
            self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)
            self.port = self._server.sockets[0].getsockname()[1]

    async def cut(self) -> None:
        server = self._server
        self.cut_now()
        if server is not None:
            with contextlib.suppress(Exception):
                await server.wait_closed()

    def cut_now(self) -> None:
        """`cut()` without waiting for the listener to close: callable where nothing may be
        awaited (from a log handler, at the very moment something is logged)."""
        server, self._server = self._server, None
        if server is not None:
            server.close()
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.transport.abort()
            return
        self._writers |= {writer, up_writer}
        await asyncio.gather(
            _pipe(reader, up_writer, self._flowing),
            _pipe(up_reader, writer, self._flowing),
            return_exceptions=True,
        )
        self._writers -= {writer, up_writer}


async def _pipe(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, flowing: asyncio.Event
) -> None:
    try:
        while data := await reader.read(65536):
            await flowing.wait()
            writer.write(data)
            await writer.drain()
    finally:
        writer.transport.abort()
