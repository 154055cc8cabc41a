"""Per-team submission rate: a token bucket per team, refilled at the team's policy rate.

The bucket lives in PostgreSQL (migrations/0037), not in a process: several API workers share
one port and each request may land on any of them, so a bucket per process would let a team
submit at its rate times the number of workers. Taking from the bucket is one round trip
(`submission_take`: the row's lock serialises concurrent takes, the database's clock refills
it); a team without a rate costs none.
"""

from __future__ import annotations

import math

import asyncpg

_TAKE = "SELECT granted, tokens FROM submission_take($1, $2, $3, $4)"


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


def retry_after(seconds: float) -> str:
    """A Retry-After header value: whole seconds, at least one."""
    return str(max(1, math.ceil(seconds)))
