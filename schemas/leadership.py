"""Scheduler leadership: each new leader raises the epoch that fences its predecessors."""

from __future__ import annotations

from pydantic import Field

from schemas.base import Event

SCHEDULER_STREAM = "scheduler"


class LeaderElected(Event):
    type = "LeaderElected"
    epoch: int = Field(ge=1)
    leader_id: str

    @property
    def stream(self) -> str:
        return SCHEDULER_STREAM


LEADERSHIP_EVENTS: tuple[type[Event], ...] = (LeaderElected,)
