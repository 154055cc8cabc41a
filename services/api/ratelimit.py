"""Per-team submission rate: a token bucket per team, refilled at the team's policy rate.

The bucket is per API process (a rate is a short-term property; several processes each hold
a team to its rate, which bounds the total at rate times processes). The clock is injected.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(slots=True)
class _Bucket:
    tokens: float
    updated: float


@dataclass(slots=True)
class SubmissionLimiter:
    clock: Callable[[], float] = time.monotonic
    _buckets: dict[str, _Bucket] = field(default_factory=dict)

    def take(self, team: str, rate: float | None, count: int = 1) -> float | None:
        """Spend `count` submissions of `team`: None when allowed, else the seconds to wait.

        The burst is one second's worth (at least one submission).
        """
        if rate is None:
            return None
        burst = max(1.0, rate)
        now = self.clock()
        bucket = self._buckets.get(team)
        if bucket is None:
            bucket = self._buckets[team] = _Bucket(burst, now)
        bucket.tokens = min(burst, bucket.tokens + (now - bucket.updated) * rate)
        bucket.updated = now
        if bucket.tokens >= count:
            bucket.tokens -= count
            return None
        return (count - bucket.tokens) / rate


def retry_after(seconds: float) -> str:
    """A Retry-After header value: whole seconds, at least one."""
    return str(max(1, math.ceil(seconds)))
