"""The scheduler process's settings: the shared runtime settings plus its own knobs."""

from __future__ import annotations

import os
import socket
from typing import Literal

from pydantic import Field

from core.policy import DEFAULT_MAX_NEW_JOBS_PER_CYCLE
from services.runtime.settings import Settings


class SchedulerSettings(Settings):
    service_name: str = "scheduler"
    # Names this replica in LeaderElected and in logs; defaults to host:pid.
    instance_id: str = Field(default_factory=lambda: f"{socket.gethostname()}:{os.getpid()}")
    # 0 picks a free port (several replicas on one machine).
    metrics_port: int = Field(default=9102, ge=0, le=65535)
    # A cycle runs at least this often, for the decisions time alone makes (grace deadlines,
    # aging, max runtime), even when no event arrives.
    scheduler_cycle_interval_s: float = Field(default=1.0, gt=0)
    # A snapshot of the folded state after this many events folded since the last one.
    scheduler_snapshot_every: int = Field(default=50_000, ge=1)
    scheduler_snapshots_kept: int = Field(default=3, ge=1)
    # PostgreSQL ends the leader's lock session after this long without a sign of life
    # (idle_session_timeout), so a paused or hung leader loses the lock and a standby takes
    # over; the leader pings its lock connection several times within it.
    scheduler_lock_timeout_s: float = Field(default=6.0, ge=1)
    scheduler_read_batch: int = Field(default=20_000, ge=1)
    # Retry backoff of failed gangs (core/retry.py): base·2^(failures-1), capped, jittered.
    scheduler_retry_backoff_base_s: float = Field(default=10.0, ge=0)
    scheduler_retry_backoff_cap_s: float = Field(default=600.0, ge=0)
    # SLO class (core/slo.py): free GPUs kept for inference-critical work (0: none), and the
    # largest gang (GPUs) preemption may evict for it.
    scheduler_inference_headroom_gpus: int = Field(default=0, ge=0)
    scheduler_inference_max_victim_gpus: int = Field(default=8, ge=1)
    # Slices and shares (core/fractional.py): FGD over the best-fit shortlist, or best fit.
    scheduler_sharing_packing: Literal["fgd", "best-fit"] = "fgd"
    # Newly queued jobs one cycle considers (core/policy.py max_new_jobs_per_cycle): a flood
    # past it is considered over cycles run one after the other.
    scheduler_max_new_jobs_per_cycle: int = Field(default=DEFAULT_MAX_NEW_JOBS_PER_CYCLE, ge=1)
    # How often a standby tries the lock and catches up with the log meanwhile.
    scheduler_standby_poll_s: float = Field(default=0.5, gt=0)
