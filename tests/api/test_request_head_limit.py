"""A request's head (its request line and headers) is bounded: past the bound the server answers
431 problem+json and closes the connection, before authentication and before any route."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator

import pytest
import uvicorn
from starlette.types import Receive, Scope, Send

from services.api.workers import server_config
from services.runtime import request_head
from services.runtime.request_head import MAX_HEAD_BYTES

STREAM_PARTS = 6


async def hello(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] != "http":
        return
    if scope["path"] == "/stream":
        # A streamed answer (as the logs' follow and the events' stream), a part at a time.
        await send({"type": "http.response.start", "status": 200, "headers": []})
        for part in range(STREAM_PARTS):
            await asyncio.sleep(0.25)
            await send({"type": "http.response.body", "body": b"part%d;" % part, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
        return
    if scope["path"] == "/read":
        # The whole body read first, as a route that parses it does.
        while (await receive()).get("more_body", False):
            pass
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"hello"})


@pytest.fixture
def address() -> Iterator[tuple[str, int]]:
    """The API's own server configuration (`server_config`) around a trivial app."""
    server = uvicorn.Server(server_config(hello, log_level="warning", lifespan="off"))
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.02)
    try:
        yield sock.getsockname()
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()


def exchange(address: tuple[str, int], request: bytes) -> bytes:
    """Send `request` (as much of it as the server takes) and read the answer to its end."""
    with socket.create_connection(address, timeout=30) as conn:
        # Closed on us mid-send: the answer was written before the close.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            conn.sendall(request)
        chunks = []
        while True:
            try:
                chunk = conn.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            chunks.append(chunk)
    return b"".join(chunks)


def request(*headers: bytes) -> bytes:
    head = b"GET /v1/jobs HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" + b"".join(headers)
    return head + b"\r\n"


def test_an_ordinary_head_is_served(address: tuple[str, int]) -> None:
    answer = exchange(address, request(b"X-Note: " + b"a" * 8000 + b"\r\n"))
    assert answer.startswith(b"HTTP/1.1 200 "), answer[:200]


@pytest.mark.parametrize(
    "headers",
    [
        # One header line of 4 MB: before the bound, a 100 MB one from an unauthenticated
        # client held 180 MB of a worker and its event loop for 15 s, every team's requests
        # on that worker waiting behind it.
        [b"X-Big: " + b"a" * 4_000_000 + b"\r\n"],
        # Many ordinary ones past the bound together.
        [b"X-H%d: %s\r\n" % (i, b"a" * 100) for i in range(2 * MAX_HEAD_BYTES // 100)],
    ],
    ids=["one-long-line", "many-lines"],
)
def test_a_head_past_the_bound_gets_431_problem_json(
    address: tuple[str, int], headers: list[bytes]
) -> None:
    answer = exchange(address, request(*headers))
    status, _, rest = answer.partition(b"\r\n")
    assert status == b"HTTP/1.1 431 Request Header Fields Too Large", answer[:200]
    head, _, body = rest.partition(b"\r\n\r\n")
    assert b"content-type: application/problem+json" in head.lower()
    problem = json.loads(body)
    assert problem["status"] == 431
    assert problem["type"] == "https://gangway.dev/problems/request-head-too-large"


def test_a_long_url_counts_too(address: tuple[str, int]) -> None:
    line = b"GET /v1/jobs?x=" + b"a" * (2 * MAX_HEAD_BYTES) + b" HTTP/1.1\r\nHost: x\r\n\r\n"
    answer = exchange(address, line)
    assert answer.startswith(b"HTTP/1.1 431 "), answer[:200]


def test_a_large_body_is_not_counted_as_head(address: tuple[str, int]) -> None:
    body = b"x" * (4 * MAX_HEAD_BYTES)
    head = b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: %d\r\n\r\n"
    answer = exchange(address, head % len(body) + body)
    assert answer.startswith(b"HTTP/1.1 200 "), answer[:200]


@pytest.fixture
def short_head_deadline(monkeypatch: pytest.MonkeyPatch) -> float:
    """A head deadline short enough for a test (the protocol reads it per connection)."""
    monkeypatch.setattr(request_head, "HEAD_TIMEOUT_S", 0.5)
    return 0.5


def trickle(address: tuple[str, int], opening: bytes, seconds: float) -> bytes:
    """Open a request with `opening`, then send one more byte of header every tenth of a second
    for `seconds` (never ending the head); what the server answered, if it did."""
    with socket.create_connection(address, timeout=30) as conn:
        conn.sendall(opening)
        deadline = time.monotonic() + seconds
        try:
            while time.monotonic() < deadline:
                time.sleep(0.1)
                conn.sendall(b"a")
        except (BrokenPipeError, ConnectionResetError):
            pass  # closed by the server: its answer may still be readable
        conn.settimeout(1)
        try:
            return conn.recv(65536)
        except (TimeoutError, ConnectionResetError):
            return b""


@pytest.mark.usefixtures("short_head_deadline")
def test_a_head_still_arriving_at_its_deadline_gets_408(address: tuple[str, int]) -> None:
    """One byte at a time, a header never ends: the connection was held for as long as the
    client liked (a few thousand of them reach a worker's open-file limit)."""
    answer = trickle(address, b"GET /v1/jobs HTTP/1.1\r\nHost: x\r\nX-Slow: ", 5.0)
    assert answer.startswith(b"HTTP/1.1 408 "), answer[:200]
    assert b"request-head-timeout" in answer


@pytest.mark.usefixtures("short_head_deadline")
def test_a_connection_that_never_starts_a_request_is_closed(address: tuple[str, int]) -> None:
    with socket.create_connection(address, timeout=30) as conn:
        conn.settimeout(10)
        assert conn.recv(65536).startswith(b"HTTP/1.1 408 ")


@pytest.mark.usefixtures("short_head_deadline")
def test_a_head_in_time_is_served_on_a_kept_alive_connection(address: tuple[str, int]) -> None:
    """The deadline armed at the connection's start ends with its first head, not later ones."""
    with socket.create_connection(address, timeout=30) as conn:
        for _ in range(3):
            conn.sendall(b"GET /v1/jobs HTTP/1.1\r\nHost: x\r\n\r\n")
            assert conn.recv(65536).startswith(b"HTTP/1.1 200 ")
            time.sleep(0.3)


@pytest.mark.usefixtures("short_head_deadline")
def test_blank_lines_between_requests_do_not_hold_a_connection(address: tuple[str, int]) -> None:
    """After a first answer on a kept-alive connection, a client sends a blank line (CRLF) now
    and then, never a request: the parser skips blank lines before a request line, so no head
    begins, and any byte read cancels uvicorn's keep-alive timer. The connection was held for as
    long as the client liked; the head deadline closes it."""
    with socket.create_connection(address, timeout=30) as conn:
        conn.sendall(b"GET /v1/jobs HTTP/1.1\r\nHost: x\r\n\r\n")
        assert conn.recv(65536).startswith(b"HTTP/1.1 200 ")
        closed = False
        deadline = time.monotonic() + 6.0  # past uvicorn's 5 s keep-alive, 12 head deadlines
        try:
            while time.monotonic() < deadline:
                time.sleep(0.1)
                conn.sendall(b"\r\n")
        except (BrokenPipeError, ConnectionResetError):
            closed = True
        answer = b""
        if not closed:
            conn.settimeout(1)
            try:
                answer = conn.recv(65536)
            except TimeoutError:
                pytest.fail("the connection was still open")
            except ConnectionResetError:
                pass
        assert answer == b"" or answer.startswith(b"HTTP/1.1 408 "), answer[:200]


def read_to_close(conn: socket.socket) -> bytes:
    chunks = []
    with contextlib.suppress(ConnectionResetError):
        while chunk := conn.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


@pytest.mark.usefixtures("short_head_deadline")
@pytest.mark.parametrize(
    "opening",
    [
        b"GET /v1/jobs HTTP/1.1\r\nHost: x\r\nX-Slow: a",  # its deadline passes
        b"GET /v1/jobs HTTP/1.1\r\nX-Big: " + b"a" * (2 * MAX_HEAD_BYTES),  # past the bound
    ],
    ids=["408", "431"],
)
def test_a_refusal_does_not_cut_into_an_answer_under_way(
    address: tuple[str, int], opening: bytes
) -> None:
    """A client pipelines a request behind a streamed answer and its head is refused while the
    answer is still streaming: the refusal was written into the middle of the streamed body,
    whose chunks then no longer parse. The answer under way ends whole, then the connection
    closes."""
    with socket.create_connection(address, timeout=30) as conn:
        conn.sendall(b"GET /stream HTTP/1.1\r\nHost: x\r\n\r\n")
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            conn.sendall(opening)
        received = read_to_close(conn)
    head, _, body = received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 "), received[:200]
    assert b"transfer-encoding: chunked" in head.lower()
    parts = b"".join(b"%x\r\npart%d;\r\n" % (len(b"part0;"), i) for i in range(STREAM_PARTS))
    assert body.startswith(parts + b"0\r\n\r\n"), body[:300]


@pytest.mark.parametrize(
    "trailers",
    [
        [b"X-T%d: %s\r\n" % (i, b"a" * 100) for i in range(2 * MAX_HEAD_BYTES // 100)],
        [b"X-Big: " + b"a" * 4_000_000 + b"\r\n"],
    ],
    ids=["many-lines", "one-long-line"],
)
def test_a_chunked_body_s_trailers_count_as_head(
    address: tuple[str, int], trailers: list[bytes]
) -> None:
    """Header fields after a chunked body's last chunk (trailers) are parsed as a head's are,
    after the head's bound: each was appended to the request's headers, and one 50 MB line
    held 190 MB of the worker, before any route or authentication."""
    answer = exchange(
        address,
        b"POST /read HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        + b"5\r\nhello\r\n0\r\n"
        + b"".join(trailers)
        + b"\r\n",
    )
    assert answer.startswith(b"HTTP/1.1 431 "), answer[:200]
    assert b"request-head-too-large" in answer


def test_a_chunked_body_with_a_few_trailers_is_served(address: tuple[str, int]) -> None:
    answer = exchange(
        address,
        b"POST /read HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
        + b"Transfer-Encoding: chunked\r\n\r\n"
        + b"5\r\nhello\r\n" * 100
        + b"0\r\nX-Checksum: abc\r\n\r\n",
    )
    assert answer.startswith(b"HTTP/1.1 200 "), answer[:200]


def read_answer(conn: socket.socket) -> bytes:
    """One answer with a content-length, read to its end (the connection left open)."""
    received = b""
    while b"\r\n\r\n" not in received:
        chunk = conn.recv(65536)
        assert chunk, f"closed before an answer: {received[:200]!r}"
        received += chunk
    head, _, body = received.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        chunk = conn.recv(65536)
        assert chunk, "closed inside the answer"
        body += chunk
    return head + b"\r\n\r\n" + body


@pytest.mark.parametrize(
    "opening",
    [
        b"GET /v1/jobs HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (2 * MAX_HEAD_BYTES),
        # The refusal behind an answer under way: that answer is the one read.
        b"GET /stream HTTP/1.1\r\nHost: x\r\n\r\n"
        + b"GET /v1/jobs HTTP/1.1\r\nX-Big: "
        + b"a" * (2 * MAX_HEAD_BYTES),
    ],
    ids=["431", "behind-an-answer"],
)
def test_a_client_still_sending_its_head_after_a_refusal_is_not_reset(
    address: tuple[str, int], opening: bytes
) -> None:
    """A client still sending its head when the server refused it: the server closed at once,
    with the client's bytes unread, so its TCP stack answered them with a reset, which may
    erase the refusal from the client's unread input before it reads it (RFC 9112 9.6); a
    client that stops at a failed send never reads it at all. The server now closes its side
    only (a lingering close, as web servers do) and reads and discards what still comes, for
    a bounded time and amount: the client's sends succeed and it reads an orderly close."""
    with socket.create_connection(address, timeout=30) as conn:
        conn.sendall(opening)
        if b"/stream" in opening:
            answer = read_to_close_or_timeout(conn, 0.25 * (STREAM_PARTS + 2))
            assert answer.startswith(b"HTTP/1.1 200 "), answer[:200]
        else:
            answer = read_answer(conn)
            assert answer.startswith(b"HTTP/1.1 431 "), answer[:200]
        # The rest of the client's head, after the refusal: still taken.
        for _ in range(8):
            conn.sendall(b"a" * 32768)
            time.sleep(0.02)
        conn.shutdown(socket.SHUT_WR)
        conn.settimeout(10)
        assert conn.recv(65536) == b""


def read_to_close_or_timeout(conn: socket.socket, seconds: float) -> bytes:
    """What arrives within `seconds` (the connection left open)."""
    conn.settimeout(seconds)
    chunks = []
    with contextlib.suppress(TimeoutError):
        while chunk := conn.recv(65536):
            chunks.append(chunk)
    conn.settimeout(30)
    return b"".join(chunks)


@pytest.fixture
def short_linger(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(request_head, "LINGER_S", 0.5)
    monkeypatch.setattr(request_head, "LINGER_BYTES", 1024 * 1024)


@pytest.mark.usefixtures("short_linger")
@pytest.mark.parametrize("pause_s", [0.0, 0.05], ids=["a-flood", "a-trickle"])
def test_a_lingering_close_is_bounded(address: tuple[str, int], pause_s: float) -> None:
    """What is read after a refusal is bounded in bytes (a flood) and in time (a trickle): a
    client that never stops sending is closed on all the same."""
    with socket.create_connection(address, timeout=30) as conn:
        conn.sendall(b"GET /v1/jobs HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (2 * MAX_HEAD_BYTES))
        assert read_answer(conn).startswith(b"HTTP/1.1 431 ")
        deadline = time.monotonic() + 10
        sent = 0
        with pytest.raises((BrokenPipeError, ConnectionResetError)):
            while time.monotonic() < deadline:
                sent += conn.send(b"a" * 65536)
                time.sleep(pause_s)
        # Within the bounds and what the two kernels' buffers hold between them.
        assert sent < 64 * 1024 * 1024
