"""The checkpoint service's settings over the shared runtime settings."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from services.runtime.settings import Settings


class CheckpointSettings(Settings):
    checkpoint_root: Path = Path(".gangway/checkpoints")
    # How long a requested (not preemption) checkpoint may take to gather every shard.
    checkpoint_timeout_s: float = Field(default=60.0, gt=0)
    # Added to a preemption's grace: the last shard may land just as the grace ends.
    collect_slack_s: float = Field(default=2.0, ge=0)
    poll_interval_s: float = Field(default=0.2, gt=0)
    metrics_port: int | None = Field(default=None, ge=0, le=65535)
