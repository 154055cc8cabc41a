"""A request's head (its request line and headers) is bounded, or answered 431 problem+json
and the connection closed: the protocol of every HTTP server of the services (the API's
workers, the agent's log endpoint).

uvicorn's httptools protocol buffers a head of any size, and the parser grows a header value by
concatenation: one unauthenticated request with a 100 MB header line held 180 MB of an API
worker and 16 s of its CPU, other requests waiting up to 21 s behind it; a rank reaches its
agent's loopback log endpoint the same way. Counted here, at the connection, before
authentication and before any route.
"""

from __future__ import annotations

import json
from typing import Any, Final

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

# The API's problem type base and media type (services/api/problems.py): the runtime does not
# import the API.
PROBLEM_BASE: Final = "https://gangway.dev/problems/"
PROBLEM_MEDIA_TYPE: Final = "application/problem+json"
# nginx's default (large_client_header_buffers 4 8k) is 32 KiB; Node's 16 KiB. What a client
# of this API sends (a token, a few headers, a URL of query parameters) is well under 8 KiB.
MAX_HEAD_BYTES: Final = 64 * 1024


def _refusal() -> bytes:
    body = json.dumps(
        {
            "type": f"{PROBLEM_BASE}request-head-too-large",
            "title": "Request Header Fields Too Large",
            "status": 431,
            "detail": f"the request line and headers exceed {MAX_HEAD_BYTES} bytes",
        }
    ).encode()
    head = (
        "HTTP/1.1 431 Request Header Fields Too Large\r\n"
        f"content-type: {PROBLEM_MEDIA_TYPE}\r\n"
        f"content-length: {len(body)}\r\n"
        "connection: close\r\n\r\n"
    )
    return head.encode("ascii") + body


_REFUSAL: Final = _refusal()


class BoundedHeadProtocol(HttpToolsProtocol):
    """httptools' protocol, counting the bytes a request's head arrives in.

    What is counted is every chunk read while a head is incomplete once the parser has seen
    it: a chunk that ends one request's body and starts the next one's head counts whole, so
    the bound may be reached up to one read (asyncio's 256 KiB) early for a pipelining client,
    never late by more than one read."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_open = False
        self._head_bytes = 0

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_open = True

    def on_headers_complete(self) -> None:
        self._head_open = False
        self._head_bytes = 0
        super().on_headers_complete()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if not self._head_open or self.transport.is_closing():
            return
        self._head_bytes += len(data)
        if self._head_bytes > MAX_HEAD_BYTES:
            self._head_open = False
            self.transport.write(_REFUSAL)
            self.transport.close()
