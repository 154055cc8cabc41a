"""The checkpoint service's settings over the shared runtime settings."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from core.checkpointing import SERVICE_MIN_INTERVAL_S
from services.runtime.settings import Settings


class CheckpointSettings(Settings):
    checkpoint_root: Path = Path(".gangway/checkpoints")
    # How long a requested (not preemption) checkpoint may take to gather every shard.
    checkpoint_timeout_s: float = Field(default=60.0, gt=0)
    # Added to a preemption's grace: the last shard may land just as the grace ends.
    collect_slack_s: float = Field(default=2.0, ge=0)
    poll_interval_s: float = Field(default=0.2, gt=0)
    # The cluster's floor under a job's `checkpoint.interval_s` (by default the one the core
    # counts with when it weighs the work an eviction loses).
    checkpoint_min_interval_s: float = Field(default=SERVICE_MIN_INTERVAL_S, ge=0)
    # Retention: the newest K good checkpoints of a job stay; everything of a job goes this
    # long after it ended; ended jobs are swept this often.
    checkpoint_keep: int = Field(default=3, ge=1)
    checkpoint_retention_s: float = Field(default=7 * 86400.0, ge=0)
    sweep_interval_s: float = Field(default=300.0, gt=0)
    metrics_port: int | None = Field(default=None, ge=0, le=65535)
