"""Teams and queues: the quota tree (org → team) with guaranteed GPUs and borrowing ceilings."""

from __future__ import annotations

from pydantic import Field, model_validator

from schemas.base import Event
from schemas.jobs import NAME_PATTERN


class TeamCreated(Event):
    """A team and its queue of the same name; the token's hash authenticates the team."""

    type = "TeamCreated"
    name: str = Field(pattern=NAME_PATTERN)
    parent: str | None = Field(default=None, pattern=NAME_PATTERN)
    guaranteed_gpus: int = Field(ge=0)
    max_gpus: int | None = Field(default=None, ge=0)
    token_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")

    @property
    def stream(self) -> str:
        return f"team-{self.name}"

    @model_validator(mode="after")
    def _max_covers_guarantee(self) -> TeamCreated:
        if self.max_gpus is not None and self.max_gpus < self.guaranteed_gpus:
            raise ValueError("max_gpus must be at least guaranteed_gpus")
        return self


class QueueConfigured(Event):
    """A queue's place in the tree, its guarantee, its ceiling (None: no ceiling) and weight."""

    type = "QueueConfigured"
    name: str = Field(pattern=NAME_PATTERN)
    parent: str | None = Field(default=None, pattern=NAME_PATTERN)
    guaranteed_gpus: int = Field(ge=0)
    max_gpus: int | None = Field(default=None, ge=0)
    weight: float = Field(default=1.0, gt=0)

    @property
    def stream(self) -> str:
        return f"queue-{self.name}"

    @model_validator(mode="after")
    def _max_covers_guarantee(self) -> QueueConfigured:
        if self.max_gpus is not None and self.max_gpus < self.guaranteed_gpus:
            raise ValueError("max_gpus must be at least guaranteed_gpus")
        return self


TEAM_EVENTS: tuple[type[Event], ...] = (TeamCreated, QueueConfigured)
