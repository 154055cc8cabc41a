"""How many long-lived streams each team holds open in this API process: followed logs
(GET /v1/jobs/{id}/logs?follow=true) and dashboard streams (GET /v1/dashboard/stream).

Each one polls (an agent, the read models, the token) in the process's one event loop for as
long as its client stays: without a bound, one team opening hundreds of them slows every other
team's requests (measured: 200 followers of one job took another team's GET /v1/jobs from 12 ms
to 2 s, median). Past its bound a team is answered 429, not queued: a stream waiting in line
would hold its connection open as well. The admin is not bounded.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field

from services.api.problems import ProblemError
from services.api.ratelimit import retry_after

# When a team turned away may try again: streams are long, so not at once.
RETRY_AFTER_S = 5.0


class StreamSlot:
    """One open stream's place; the stream holds it. A stream that ends gives it back; one
    whose client left before it ever ran is dropped with its slot (weakly held here), so a
    slot is never leaked."""

    __slots__ = ("__weakref__", "team")

    def __init__(self, team: str) -> None:
        self.team = team


@dataclass(slots=True)
class StreamGate:
    _open: dict[str, weakref.WeakSet[StreamSlot]] = field(default_factory=dict)

    def enter(self, team: str, limit: int) -> StreamSlot | None:
        """One of the team's `limit` slots, or None when all are taken."""
        slots = self._open.setdefault(team, weakref.WeakSet())
        if len(slots) >= limit:
            return None
        slot = StreamSlot(team)
        slots.add(slot)
        return slot

    def admit(self, team: str, limit: int) -> StreamSlot:
        """One of the team's `limit` slots; 429 problem+json when all are taken."""
        slot = self.enter(team, limit)
        if slot is None:
            raise ProblemError(
                429,
                "too-many-streams",
                f"team {team!r} already holds {limit} followed logs or dashboard streams open "
                "in this API process; close one first",
                headers={"Retry-After": retry_after(RETRY_AFTER_S)},
            )
        return slot

    def leave(self, slot: StreamSlot) -> None:
        self._open.get(slot.team, weakref.WeakSet()).discard(slot)

    def open(self, team: str) -> int:
        return len(self._open.get(team, ()))
