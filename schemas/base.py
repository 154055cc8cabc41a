"""The base of every event: a frozen fact with a stable type name and a schema version."""

from __future__ import annotations

from abc import abstractmethod
from typing import ClassVar

from pydantic import BaseModel, ConfigDict


class Event(BaseModel):
    """A fact in the past tense, immutable once recorded.

    `type` is the event's name in the log and on the bus; it is written out per class
    (never derived from `__name__`) so that renaming the code never renames the data.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    type: ClassVar[str]
    schema_version: ClassVar[int] = 1

    @property
    @abstractmethod
    def stream(self) -> str:
        """The stream this event is appended to (`job-<id>`, `node-<id>` …)."""


class Message(BaseModel):
    """A value carried inside events or on the telemetry topic; frozen like events."""

    model_config = ConfigDict(frozen=True, extra="forbid")
