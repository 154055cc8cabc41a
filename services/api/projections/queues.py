"""The queue and team read models: the quota tree and each team's token hash."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

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
    max_cpus: int | None = None
    max_memory_mb: int | None = None


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
    fold = _QUEUE_FOLDS.get(type(event))
    return queue if fold is None else fold(queue, event, at)


def evolve_team(team: TeamRecord | None, event: Event, *, at: datetime) -> TeamRecord | None:
    fold = _TEAM_FOLDS.get(type(event))
    return team if fold is None else fold(team, event, at)


def _on_queue_configured(
    queue: QueueRecord | None, event: QueueConfigured, at: datetime
) -> QueueRecord:
    return QueueRecord(
        name=event.name,
        parent=event.parent,
        guaranteed_gpus=event.guaranteed_gpus,
        max_gpus=event.max_gpus,
        weight=event.weight,
        updated_at=at,
        max_cpus=event.max_cpus,
        max_memory_mb=event.max_memory_mb,
    )


def _on_team_created_queue(
    queue: QueueRecord | None, event: TeamCreated, at: datetime
) -> QueueRecord:
    # The team's queue by default; a queue already configured under that name stays as it is.
    if queue is not None:
        return queue
    return QueueRecord(
        name=event.name,
        parent=event.parent,
        guaranteed_gpus=event.guaranteed_gpus,
        max_gpus=event.max_gpus,
        weight=1.0,
        updated_at=at,
    )


def _on_team_created(team: TeamRecord | None, event: TeamCreated, at: datetime) -> TeamRecord:
    # A team is created once; a duplicate creation keeps the first record (and its token).
    if team is not None:
        return team
    return TeamRecord(
        name=event.name,
        parent=event.parent,
        guaranteed_gpus=event.guaranteed_gpus,
        max_gpus=event.max_gpus,
        token_sha256=event.token_sha256,
        created_at=at,
    )


# The folds' dispatch tables: each event class the queue and team read models read.
_QUEUE_FOLDS: dict[type[Event], Callable[[QueueRecord | None, Any, datetime], QueueRecord]] = {
    QueueConfigured: _on_queue_configured,
    TeamCreated: _on_team_created_queue,
}
_TEAM_FOLDS: dict[type[Event], Callable[[TeamRecord | None, Any, datetime], TeamRecord]] = {
    TeamCreated: _on_team_created,
}
