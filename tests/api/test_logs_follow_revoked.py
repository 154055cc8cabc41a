"""A followed log shows nothing written after its token was revoked (routers/logs.py, `_follow`),
however the revocation falls between the stream's polls."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from services.api.routers import logs as logs_router
from services.api.routers.logs import Chunk, RankLog


@dataclass
class Rank:
    """A rank's log on its agent, and whether the token is revoked yet."""

    data: bytes = b"before\n"
    revoked: bool = False
    checks: list[bool] = field(default_factory=list)


@dataclass
class _Settings:
    logs_poll_s: float = 0.0


@dataclass
class _Models:
    jobs: dict[str, Any] = field(default_factory=dict)


class _Context:
    settings = _Settings()

    async def fresh(self) -> _Models:
        return _Models()  # the job is gone: the stream ends after what it has read


async def test_bytes_written_after_a_revocation_are_not_shown(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The token was checked once per poll, before reading: a line written just after the
    revocation, read in the same poll right after the first chunk, was shown (the e2e test
    `test_following_ends_when_the_token_is_revoked` failed so under load)."""
    rank = Rank()

    async def fetch(
        client: httpx.AsyncClient, source: RankLog, *, offset: int = 0, tail: int | None = None
    ) -> Chunk | None:
        if offset == len(rank.data) and not rank.revoked:
            # Between the first chunk and the next read: the token is revoked, then written.
            rank.revoked = True
            rank.data += b"after the revocation\n"
        return Chunk(rank.data[offset:], offset, False)

    async def still_authorized(request: object, context: object) -> bool:
        rank.checks.append(not rank.revoked)
        return not rank.revoked

    monkeypatch.setattr(logs_router, "_fetch", fetch)
    monkeypatch.setattr(logs_router, "still_authorized", still_authorized)
    source = RankLog("a1b2c3d4e5f6", 1, 0, "http://agent", b"key")
    async with httpx.AsyncClient() as client:
        stream = logs_router._follow(
            None,  # type: ignore[arg-type]
            _Context(),  # type: ignore[arg-type]
            client,
            source,
            Chunk(b"before\n", 0, False),
            None,
        )
        shown = b"".join([data async for data in stream])
    assert shown == b"before\n"
    assert rank.checks[-1] is False
