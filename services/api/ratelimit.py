"""Rates: a team's submissions and commands (token buckets shared by every API process) and a
team's reads (a token bucket in each process).

The bucket lives in PostgreSQL (migrations/0037), not in a process: several API workers share
one port and each request may land on any of them, so a bucket per process would let a team
submit at its rate times the number of workers. Taking from the bucket is one round trip
(`submission_take`: the row's lock serialises concurrent takes, the database's clock refills
it); a team without a rate costs none. A team's commands on jobs (hold, release, PATCH, cancel,
suspend, resume) take from a bucket of their own (`commands:<team>`; no team name holds a colon)
the same way: each may append to the one log every team shares.

Reads are bounded per process instead (`ReadLimiter`): what they use up is the process's own
event loop, not the log, and a database round trip per read would cost more than most reads.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import asyncpg

from services.api.problems import ProblemError

_TAKE = "SELECT granted, tokens FROM submission_take($1, $2, $3, $4)"

# A read whose answer carries job specs (an array's view, a listing page, an array command's
# answer) costs one read per this many bytes of them, as weighed by routers/jobs.spec_bytes:
# building such an answer holds the event loop every team shares, about a millisecond per
# 10 KB here, so that a team's reads a second bound its share of it whatever they carry.
READ_ANSWER_BYTES = 4096


class SubmissionLimiter:
    """The teams' shared buckets, in the database of `pool`."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool

    async def take(self, team: str, rate: float | None, count: int = 1) -> float | None:
        """Spend `count` submissions of `team`: None when allowed, else the seconds to wait.

        The burst is one second's worth (at least `count`, so that a request is never refused
        for ever).
        """
        if rate is None:
            return None
        burst = max(float(count), rate)
        granted, tokens = await self.pool.fetchrow(_TAKE, team, rate, burst, float(count))
        if granted:
            return None
        return (count - float(tokens)) / rate


class ReadLimiter:
    """A token bucket per caller in this process, refilled at `rate` a second up to one
    second's worth (at least one read).

    With `max_callers`, only that many callers' buckets are kept (the least recently seen is
    forgotten, and starts full again): the callers are then client addresses, which a flood
    may not make the process remember without bound."""

    def __init__(
        self, clock: Callable[[], float] = time.monotonic, *, max_callers: int | None = None
    ) -> None:
        self._clock = clock
        self._max_callers = max_callers
        # caller -> (tokens, when they were counted), least recently seen first
        self._buckets: dict[str, tuple[float, float]] = {}

    def take(self, caller: str, rate: float | None) -> float | None:
        """Spend one read of `caller`: None when allowed, else the seconds to wait."""
        return self._spend(caller, rate, 1.0, need=1.0)

    def charge(
        self, caller: str, rate: float | None, count: float, *, refusable: bool = True
    ) -> float | None:
        """Spend `count` more reads of `caller` for a heavy answer about to be built: None
        when allowed, the bucket going into debt if need be (a heavy answer is never refused
        for ever; the caller's next reads wait until the debt is paid), else, while the
        bucket is in debt (`refusable`), the seconds to wait: what it would pay for is not
        built. Not `refusable`: an answer to a change already made, paid for all the same."""
        return self._spend(caller, rate, count, need=0.0 if refusable else -math.inf)

    def _spend(self, caller: str, rate: float | None, count: float, *, need: float) -> float | None:
        if rate is None:
            return None
        burst = max(1.0, rate)
        now = self._clock()
        tokens, then = self._buckets.pop(caller, (burst, now))
        tokens = min(burst, tokens + max(0.0, now - then) * rate)
        granted = tokens >= need
        self._buckets[caller] = (tokens - count if granted else tokens, now)
        if self._max_callers is not None and len(self._buckets) > self._max_callers:
            del self._buckets[next(iter(self._buckets))]
        return None if granted else (1.0 - tokens) / rate

    def give_back(self, caller: str, rate: float | None) -> None:
        """Return one taken read of `caller` (what it was spent on turned out free)."""
        if rate is None or caller not in self._buckets:
            return
        tokens, then = self._buckets[caller]
        self._buckets[caller] = (min(max(1.0, rate), tokens + 1.0), then)


def retry_after(seconds: float) -> str:
    """A Retry-After header value: whole seconds, at least one."""
    return str(max(1, math.ceil(seconds)))


def rate_limited(detail: str, wait: float) -> ProblemError:
    """The 429 of a team past one of its rates, with when to try again."""
    return ProblemError(429, "rate-limited", detail, headers={"Retry-After": retry_after(wait)})
