"""Riding out an outage quietly: jittered backoff, and one log line per change of state.

A process that loses its database or its broker retries until it is back, without exiting and
without flooding its log: `Outage` logs when the dependency is lost, a summary every
`summary_every_s` while it stays away, and when it has recovered (with how long it took); the
attempts in between are counted, not logged.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from services.runtime.metrics import watch_dependency

T = TypeVar("T")


class Backoff:
    """Exponential backoff with full jitter (AWS's "full jitter"): many clients that lost the
    same server do not all come back in the same instant."""

    def __init__(
        self, initial_s: float = 0.1, max_s: float = 5.0, *, rng: random.Random | None = None
    ) -> None:
        self.initial_s = initial_s
        self.max_s = max_s
        self._ceiling = initial_s
        self._rng = rng or random.Random()

    def next_delay(self) -> float:
        delay = self._rng.uniform(self._ceiling / 2, self._ceiling)
        self._ceiling = min(self._ceiling * 2, self.max_s)
        return delay

    def reset(self) -> None:
        self._ceiling = self.initial_s


class Outage:
    """The state of one dependency as a process sees it: up, or down since when."""

    def __init__(
        self,
        log: logging.Logger,
        what: str,
        *,
        summary_every_s: float = 30.0,
        backoff: Backoff | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.log = log
        self.what = what
        self.summary_every_s = summary_every_s
        self.backoff = backoff or Backoff()
        self.clock = clock
        self.down_since: float | None = None
        self.attempts = 0
        self.outages = 0
        self._summary_at = 0.0
        watch_dependency(self)

    @property
    def down(self) -> bool:
        return self.down_since is not None

    def failed(self, error: BaseException) -> float:
        """Note a failed attempt; the delay before the next one."""
        now = self.clock()
        if self.down_since is None:
            self.down_since = self._summary_at = now
            self.attempts = 0
            self.outages += 1
            self.log.warning("%s lost: %r; retrying with backoff", self.what, error)
        elif now - self._summary_at >= self.summary_every_s:
            self._summary_at = now
            self.log.warning(
                "%s still unavailable after %.0f s (%d attempts; last: %r)",
                self.what,
                now - self.down_since,
                self.attempts,
                error,
            )
        self.attempts += 1
        return self.backoff.next_delay()

    def recovered(self) -> None:
        if self.down_since is not None:
            self.log.warning(
                "%s recovered after %.1f s (%d attempts)",
                self.what,
                self.clock() - self.down_since,
                self.attempts,
            )
            self.down_since = None
        self.backoff.reset()

    async def sleep(self, error: BaseException, stop: asyncio.Event | None) -> bool:
        """`failed`, then wait out the delay (less if `stop` is set); whether it is set."""
        delay = self.failed(error)
        if stop is None:
            await asyncio.sleep(delay)
            return False
        try:
            await asyncio.wait_for(stop.wait(), delay)
        except TimeoutError:
            return False
        return True


async def until_available(
    attempt: Callable[[], Awaitable[T]],
    outage: Outage,
    stop: asyncio.Event | None,
    *,
    transient: tuple[type[BaseException], ...],
) -> T | None:
    """`attempt()` until it passes (its result) or `stop` is set (None); only `transient`
    errors are retried, any other propagates."""
    while stop is None or not stop.is_set():
        try:
            result = await attempt()
        except transient as error:
            if await outage.sleep(error, stop):
                return None
            continue
        outage.recovered()
        return result
    return None
