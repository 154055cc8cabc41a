"""A request's head (its request line and headers) is bounded in size and in time, or answered
431 or 408 problem+json and the connection closed: the protocol of every HTTP server of the
services (the API's workers, the agent's log endpoint).

uvicorn's httptools protocol buffers a head of any size, and the parser grows a header value by
concatenation: one unauthenticated request with a 100 MB header line held 180 MB of an API
worker and 16 s of its CPU, other requests waiting up to 21 s behind it; a rank reaches its
agent's loopback log endpoint the same way. Counted here, at the connection, before
authentication and before any route.

A head that never ends (a byte of header now and then), or a connection that never starts a
request, was held as long as the client liked: uvicorn has no head deadline, and its keep-alive
timer runs only between requests. A few thousand such connections reach a worker's open-file
limit. A head now has HEAD_TIMEOUT_S from the first read that did not hold it whole (or from
the connection's start).

A refusal closes the server's side only, then reads and discards what the client still sends
(a lingering close, as Apache and nginx do) for LINGER_S or LINGER_BYTES at most: closed at
once, with the client's bytes unread, the server's TCP stack answered them with a reset, which
may erase the refusal from the client's unread input (RFC 9112 9.6), and a client still
sending its head saw its send fail and never read the refusal.
"""

from __future__ import annotations

import json
from asyncio import TimerHandle
from typing import Any, Final

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

# The API's problem type base and media type (services/api/problems.py): the runtime does not
# import the API.
PROBLEM_BASE: Final = "https://gangway.dev/problems/"
PROBLEM_MEDIA_TYPE: Final = "application/problem+json"
# nginx's default (large_client_header_buffers 4 8k) is 32 KiB; Node's 16 KiB. What a client
# of this API sends (a token, a few headers, a URL of query parameters) is well under 8 KiB.
MAX_HEAD_BYTES: Final = 64 * 1024
# nginx's client_header_timeout is 60 s; the API gives a body 10 s (services/api/timeouts.py).
HEAD_TIMEOUT_S = 10.0
# After a refusal: how long, and how many bytes, the rest of a request is read and discarded
# (Apache lingers 2 s; nginx 5 s between reads, 30 s in all). Enough for a client to finish
# sending a refused head of a few MB on a local network and read the answer; a client that
# never stops is closed on when either runs out.
LINGER_S = 2.0
LINGER_BYTES = 4 * 1024 * 1024


def _refusal(status: int, reason: str, slug: str, detail: str) -> bytes:
    body = json.dumps(
        {"type": f"{PROBLEM_BASE}{slug}", "title": reason, "status": status, "detail": detail}
    ).encode()
    head = (
        f"HTTP/1.1 {status} {reason}\r\n"
        f"content-type: {PROBLEM_MEDIA_TYPE}\r\n"
        f"content-length: {len(body)}\r\n"
        "connection: close\r\n\r\n"
    )
    return head.encode("ascii") + body


_TOO_LARGE: Final = _refusal(
    431,
    "Request Header Fields Too Large",
    "request-head-too-large",
    f"the request line and headers exceed {MAX_HEAD_BYTES} bytes",
)
_TOO_SLOW: Final = _refusal(
    408,
    "Request Timeout",
    "request-head-timeout",
    "the request line and headers did not arrive in time",
)


class BoundedHeadProtocol(HttpToolsProtocol):
    """httptools' protocol, counting the bytes a request's head arrives in.

    What is counted is every chunk read while a head is incomplete once the parser has seen
    it: a chunk that ends one request's body and starts the next one's head counts whole, so
    the bound may be reached up to one read (asyncio's 256 KiB) early for a pipelining client,
    never late by more than one read."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_open = False
        self._in_message = False
        self._refused = False
        self._head_bytes = 0
        # A chunked body's trailers (header fields after its last chunk) are bounded as a
        # head is: from a chunk's header until body bytes follow it (none do the last one's).
        self._after_chunk_header = False
        self._trailer_bytes = 0
        self._head_deadline: TimerHandle | None = None
        # A lingering close under way (None: none): what is still read is discarded.
        self._linger_deadline: TimerHandle | None = None
        self._lingered_bytes = 0

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        self._start_deadline()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_deadline()
        if self._linger_deadline is not None:
            self._linger_deadline.cancel()
        super().connection_lost(exc)

    def on_response_complete(self) -> None:
        if self._refused and not self.transport.is_closing():
            # The answer under way is complete: the refused head's connection closes now,
            # and nothing queued behind it is started.
            self._linger()
            return
        super().on_response_complete()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_open = True
        self._in_message = True

    def on_message_complete(self) -> None:
        self._in_message = False
        self._after_chunk_header = False
        self._trailer_bytes = 0
        super().on_message_complete()

    def on_chunk_header(self) -> None:
        self._after_chunk_header = True

    def on_body(self, body: bytes) -> None:
        self._after_chunk_header = False
        self._trailer_bytes = 0
        super().on_body(body)

    def on_headers_complete(self) -> None:
        self._head_open = False
        self._head_bytes = 0
        self._cancel_deadline()
        super().on_headers_complete()

    def data_received(self, data: bytes) -> None:
        if self._linger_deadline is not None:
            self._lingered_bytes += len(data)
            if self._lingered_bytes > LINGER_BYTES:
                self.transport.close()
            return
        if self._refused:
            # Refused behind an answer still under way: what follows is not parsed (uvicorn
            # resumes reading when an earlier pipelined answer completes).
            self.flow.pause_reading()
            return
        super().data_received(data)
        if self.transport.is_closing():
            return
        if self._after_chunk_header:
            # What httptools buffers of trailers (it grows a field by concatenation, as in a
            # head, and uvicorn appends each to the request's headers) is counted here.
            self._trailer_bytes += len(data)
            if self._trailer_bytes > MAX_HEAD_BYTES:
                self._refuse(_TOO_LARGE, trailers=True)
            return
        if not self._head_open:
            # Bytes between requests that begin none (the parser skips blank lines before a
            # request line) on an idle connection: they cancel uvicorn's keep-alive timer, so
            # a blank line now and then held the connection for ever. The head's deadline runs
            # from them instead, until a head arrives whole.
            if not self._in_message and self._head_deadline is None and self._idle():
                self._start_deadline()
            return
        # A head that did not arrive whole in one read: armed here, not at each request's
        # start, so that the usual request (its head in one read) costs no timer.
        if self._head_deadline is None:
            self._start_deadline()
        self._head_bytes += len(data)
        if self._head_bytes > MAX_HEAD_BYTES:
            self._refuse(_TOO_LARGE)

    def _idle(self) -> bool:
        """No answer under way (none begun, or the last one complete)."""
        return self.cycle is None or self.cycle.response_complete

    def _start_deadline(self) -> None:
        self._cancel_deadline()
        self._head_deadline = self.loop.call_later(HEAD_TIMEOUT_S, self._refuse, _TOO_SLOW)

    def _cancel_deadline(self) -> None:
        if self._head_deadline is not None:
            self._head_deadline.cancel()
            self._head_deadline = None

    def _refuse(self, answer: bytes, *, trailers: bool = False) -> None:
        self._head_open = False
        self._cancel_deadline()
        if self.transport.is_closing():
            return
        # Trailers are the current request's: its answer, if not begun, is the refusal.
        own = trailers and not self.cycle.response_started and not self.pipeline
        if not own and not self._idle():
            # A head pipelined behind an answer still under way: the refusal written now
            # would land inside that answer (between a streamed body's chunks). Nothing more
            # is read, and the connection closes once that answer is complete (as uvicorn's
            # graceful shutdown does), without the refusal.
            # The answer keeps its keep-alive: uvicorn would close at once when it completes,
            # with this head's bytes unread; on_response_complete closes lingering instead.
            self._refused = True
            self.flow.pause_reading()
            return
        self.transport.write(answer)
        self._linger()

    def _linger(self) -> None:
        """Close this side once what is written is sent, then read and discard what the
        client still sends until it closes its side, or LINGER_S or LINGER_BYTES run out."""
        if self._linger_deadline is not None:
            return
        self._unset_keepalive_if_required()
        self._linger_deadline = self.loop.call_later(LINGER_S, self.transport.close)
        self.transport.write_eof()
        # Reading may have been paused (a refusal behind an answer, flow control).
        if not self.transport.is_reading():
            self.transport.resume_reading()
