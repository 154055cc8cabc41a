"""How many followed logs (GET /v1/jobs/{id}/logs?follow=true) each team holds open in this
API process.

A followed log polls its agent and the read models every `logs_poll_s` in the process's one
event loop for as long as the client stays: without a bound, one team opening hundreds of
followers of its own job slows every other team's requests (measured: another team's
GET /v1/jobs from 12 ms to 2 s). Past its bound a team is answered 429, not queued: a follower
waiting in line would hold its connection open as well.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field


class FollowSlot:
    """One open follower's place; the stream holds it. A stream that ends gives it back; one
    whose client left before it ever ran is dropped with its slot (weakly held here), so a
    slot is never leaked."""

    __slots__ = ("__weakref__", "team")

    def __init__(self, team: str) -> None:
        self.team = team


@dataclass(slots=True)
class FollowGate:
    _open: dict[str, weakref.WeakSet[FollowSlot]] = field(default_factory=dict)

    def enter(self, team: str, limit: int) -> FollowSlot | None:
        """One of the team's `limit` slots, or None when all are taken."""
        slots = self._open.setdefault(team, weakref.WeakSet())
        if len(slots) >= limit:
            return None
        slot = FollowSlot(team)
        slots.add(slot)
        return slot

    def leave(self, slot: FollowSlot) -> None:
        self._open.get(slot.team, weakref.WeakSet()).discard(slot)

    def open(self, team: str) -> int:
        return len(self._open.get(team, ()))
