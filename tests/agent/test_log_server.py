"""The agent's log endpoint (services/agent/log_server.py) and log retention (services/agent/
logs.py): only requests signed with the services' key are answered; offset and tail; whether the
attempt still runs; the logs of attempts ended longer ago than the retention go."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from services.agent import logs
from services.agent.log_server import AUTH_HEADER, LogServer, auth_header, create_app
from tests.api.test_request_head_limit import exchange

KEY = b"the services' shared key, for this test"


@dataclass
class Served:
    root: Path
    url: str
    running: set[tuple[str, int]] = field(default_factory=set)


def write_log(root: Path, job_id: str, attempt: int, rank: int, text: str) -> Path:
    path = logs.rank_log(root, job_id, attempt, rank).path
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[Served]:
    root = (tmp_path / "agent").resolve()
    root.mkdir()
    server = LogServer("127.0.0.1", 0)
    state = Served(root, server.url)
    await server.start(create_app(root, KEY, lambda job, attempt: (job, attempt) in state.running))
    try:
        yield state
    finally:
        await server.stop()


async def get(served: Served, target: str, key: bytes | None = KEY) -> httpx.Response:
    headers = {} if key is None else {AUTH_HEADER: auth_header(key, "GET", target)}
    async with httpx.AsyncClient(base_url=served.url) as client:
        return await client.get(target, headers=headers)


async def test_a_signed_request_reads_a_log_from_an_offset_or_its_last_lines(
    served: Served,
) -> None:
    write_log(served.root, "j1", 1, 0, "one\ntwo\nthree\n")
    whole = await get(served, "/v1/logs/j1/1/0")
    assert whole.status_code == 200
    assert whole.content == b"one\ntwo\nthree\n"
    assert whole.headers["X-Gangway-Offset"] == "0"
    assert whole.headers["X-Gangway-Ended"] == "true"  # no rank of it runs here

    served.running.add(("j1", 1))
    later = await get(served, "/v1/logs/j1/1/0?offset=4")
    assert (later.content, later.headers["X-Gangway-Ended"]) == (b"two\nthree\n", "false")
    last = await get(served, "/v1/logs/j1/1/0?tail=1")
    assert (last.content, last.headers["X-Gangway-Offset"]) == (b"three\n", "8")

    assert (await get(served, "/v1/logs/j1/2/0")).status_code == 404
    assert (await get(served, "/v1/logs/j1/1/0?offset=-1")).status_code == 400


async def test_anything_not_signed_with_the_services_key_is_refused(served: Served) -> None:
    write_log(served.root, "j1", 1, 0, "secret output\n")
    target = "/v1/logs/j1/1/0"
    for response in (
        await get(served, target, key=None),
        await get(served, target, key=b"a rank's guess"),
    ):
        assert response.status_code == 403
        assert b"secret" not in response.content
    # A signature is for one path and query: it does not open another rank's log.
    signed_for_rank_1 = auth_header(KEY, "GET", "/v1/logs/j1/1/1")
    async with httpx.AsyncClient(base_url=served.url) as client:
        moved = await client.get(target, headers={AUTH_HEADER: signed_for_rank_1})
        assert moved.status_code == 403
        # Nor does an expired one.
        expired = auth_header(KEY, "GET", target, now=time.time() - 3600)
        assert (await client.get(target, headers={AUTH_HEADER: expired})).status_code == 403


async def test_a_symlink_a_rank_leaves_is_not_followed(served: Served, tmp_path: Path) -> None:
    secret = tmp_path / "control-plane.secret"
    secret.write_text("admin token\n")
    path = logs.rank_log(served.root, "j1", 1, 0).path
    path.parent.mkdir(parents=True)
    path.symlink_to(secret)
    response = await get(served, "/v1/logs/j1/1/0")
    assert response.status_code == 404
    assert b"admin token" not in response.content


def test_retention_deletes_attempts_ended_longer_ago_than_it_keeps(tmp_path: Path) -> None:
    root = tmp_path / "agent"
    old = write_log(root, "done", 1, 0, "old\n")
    write_log(root, "done", 2, 0, "recent\n")
    write_log(root, "busy", 1, 0, "still running\n")
    now = time.time()
    # Attempt 1 of `done` and the running `busy` last wrote an hour ago.
    long_ago = now - 3600
    for path in (old, old.parent, old.parent.parent):
        os.utime(path, (long_ago, long_ago))
    busy = logs.rank_log(root, "busy", 1, 0).path
    for path in (busy, busy.parent, busy.parent.parent):
        os.utime(path, (long_ago, long_ago))

    gone = logs.retire(root, now, keep_s=60, running=lambda job, attempt: job == "busy")

    assert gone == [("done", 1)]
    assert not old.parent.parent.exists()
    assert logs.rank_log(root, "done", 2, 0).path.read_text() == "recent\n"
    assert busy.read_text() == "still running\n"
    # With no retention left at all, the finished job goes whole, directory included.
    left = logs.retire(root, now, keep_s=0, running=lambda job, attempt: False)
    assert sorted(left) == [("busy", 1), ("done", 2)]
    assert not (root / "done").exists()


async def test_a_head_past_the_bound_is_refused_before_the_signature_is_checked(
    served: Served,
) -> None:
    """A rank reaches the agent's loopback port. Its unsigned request with a 4 MB header line
    was read whole before the 403 (one of 100 MB cost a server 16 s of CPU and 195 MB), in the
    agent that heartbeats and launches for the whole node."""
    host, port = served.url.removeprefix("http://").rsplit(":", 1)
    request = b"GET /v1/logs/j1/1/0 HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 4_000_000
    answer = await asyncio.to_thread(exchange, (host, int(port)), request)
    assert answer.startswith(b"HTTP/1.1 431 "), answer[:200]
