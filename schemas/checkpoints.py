"""Sharded checkpoints: requested, committed (every shard durable), found corrupted."""

from __future__ import annotations

from pydantic import Field

from schemas.base import Event, Message


class CheckpointShard(Message):
    rank: int = Field(ge=0)
    uri: str
    bytes: int = Field(ge=0)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


class CheckpointEvent(Event):
    job_id: str = Field(min_length=1, max_length=64)

    @property
    def stream(self) -> str:
        return f"checkpoint-{self.job_id}"


class CheckpointRequested(CheckpointEvent):
    type = "CheckpointRequested"
    attempt: int = Field(ge=1)
    reason: str


class CheckpointCommitted(CheckpointEvent):
    """Every shard of one step is durable; a job resumes from its latest committed checkpoint."""

    type = "CheckpointCommitted"
    attempt: int = Field(ge=1)
    checkpoint_id: str
    step: int = Field(ge=0)
    shards: list[CheckpointShard] = Field(min_length=1)


class CheckpointCorrupted(CheckpointEvent):
    type = "CheckpointCorrupted"
    checkpoint_id: str
    reason: str


class CheckpointFailed(CheckpointEvent):
    """A requested checkpoint ended without a commit: a rank could not write its shard, the
    shards did not all arrive in time, or the attempt was released before they were verified.
    The job keeps its last committed checkpoint."""

    type = "CheckpointFailed"
    attempt: int = Field(ge=1)
    checkpoint_id: str
    reason: str


CHECKPOINT_EVENTS: tuple[type[Event], ...] = (
    CheckpointRequested,
    CheckpointCommitted,
    CheckpointCorrupted,
    CheckpointFailed,
)
