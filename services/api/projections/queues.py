"""The queue and team read models: the quota tree and each team's token hash."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from schemas.base import Event
from schemas.teams import QueueConfigured, TeamCreated


@dataclass(frozen=True, slots=True)
class QueueRecord:
    name: str
    parent: str | None
    guaranteed_gpus: int
    max_gpus: int | None
    weight: float
    updated_at: datetime


@dataclass(frozen=True, slots=True)
class TeamRecord:
    name: str
    parent: str | None
    guaranteed_gpus: int
    max_gpus: int | None
    token_sha256: str
    created_at: datetime


def evolve_queue(queue: QueueRecord | None, event: Event, *, at: datetime) -> QueueRecord | None:
    """A team's creation also defines its queue (of the same name) until a QueueConfigured."""
    match event:
        case QueueConfigured():
            return QueueRecord(
                name=event.name,
                parent=event.parent,
                guaranteed_gpus=event.guaranteed_gpus,
                max_gpus=event.max_gpus,
                weight=event.weight,
                updated_at=at,
            )
        case TeamCreated() if queue is None:
            return QueueRecord(
                name=event.name,
                parent=event.parent,
                guaranteed_gpus=event.guaranteed_gpus,
                max_gpus=event.max_gpus,
                weight=1.0,
                updated_at=at,
            )
    return queue


def evolve_team(team: TeamRecord | None, event: Event, *, at: datetime) -> TeamRecord | None:
    if isinstance(event, TeamCreated) and team is None:
        return TeamRecord(
            name=event.name,
            parent=event.parent,
            guaranteed_gpus=event.guaranteed_gpus,
            max_gpus=event.max_gpus,
            token_sha256=event.token_sha256,
            created_at=at,
        )
    return team
