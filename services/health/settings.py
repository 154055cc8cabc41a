"""The health service's settings over the shared runtime settings."""

from __future__ import annotations

from pydantic import Field

from services.runtime.settings import Settings


class HealthSettings(Settings):
    gpu_temperature_c: float = 87.0
    thermal_samples: int = Field(default=3, ge=1)
    nic_ratio: float = Field(default=0.8, gt=0, le=1)
    straggler_ratio: float = Field(default=1.5, gt=1)
    # Healthy heartbeats in a row before a GPU or a node drained for health returns.
    recovery_samples: int = Field(default=10, ge=1)
    # Older samples (read back from the topic after a restart) are not judged again.
    max_sample_age_s: float = Field(default=60.0, gt=0)
    # How often the service re-reads the log for operators' undrains and GPU recoveries.
    log_poll_interval_s: float = Field(default=2.0, gt=0)
    metrics_port: int | None = Field(default=None, ge=0, le=65535)
