"""The agent's settings over the shared runtime settings."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from services.runtime.settings import Settings


class AgentSettings(Settings):
    # The nodes to run agents for: the cluster spec (simulated fleet) unless NVML finds GPUs.
    cluster: str = "16x8:4:2"
    discovery: str = "auto"
    node_id: str | None = None
    node_rack: str = "r000"
    node_block: str = "b00"

    heartbeat_interval_s: float = Field(default=1.0, gt=0)
    # A file per node here injects faults into its (simulated) telemetry; see faults.py.
    fault_dir: Path = Path(".gangway/faults")
    # Ranks' working directories and logs.
    work_dir: Path = Path(".gangway/agent")
    checkpoint_root: Path = Path(".gangway/checkpoints")
    # After SIGTERM, how long a rank may take to exit before SIGKILL.
    stop_timeout_s: float = Field(default=5.0, ge=0)
    consumer_group: str | None = None
    # Ranks under a user of their team's (services/agent/isolation.py): `auto` when root.
    rank_isolation: Literal["auto", "on", "off"] = "auto"
    # Each rank in a bubblewrap sandbox (`auto`: where bwrap is installed and works).
    rank_sandbox: Literal["auto", "bwrap", "none"] = "auto"
    metrics_port: int | None = Field(default=None, ge=0, le=65535)
    # The ranks' logs, served to the API only (services/agent/log_server.py): loopback unless
    # told otherwise (port 0: a free one, for tests).
    # The API finds it by its GANGWAY_AGENT_LOGS_URL (services/api/settings.py).
    log_host: str = "127.0.0.1"
    log_port: int = Field(default=9150, ge=0, le=65535)
    # An attempt's working directory and logs are deleted this long after it ended.
    log_retention_s: float = Field(default=7 * 24 * 3600.0, ge=0)
    log_retention_check_s: float = Field(default=300.0, gt=0)
    # A rank's disk (services/agent/disk.py): what its working directory may hold when its job
    # gives no `disk_mb_per_task`, the most any job may ask, the files and directories it may
    # make, and how often it is measured.
    rank_disk_mb: int = Field(default=20_480, ge=1)
    rank_disk_max_mb: int = Field(default=204_800, ge=1)
    rank_disk_max_entries: int = Field(default=100_000, ge=1)
    disk_check_s: float = Field(default=5.0, gt=0)
    # MPS shares' control daemons (services/agent/mps.py): `per-gpu`, one the agent runs for
    # each GPU hosting a share; `host`, the operator's one daemon at the agent's
    # CUDA_MPS_PIPE_DIRECTORY (else /tmp/nvidia-mps), which serves one user at a time, so one
    # team's share waits for another's on any GPU; `auto`, per GPU where
    # nvidia-cuda-mps-control is on PATH. Simulated nodes start no daemon.
    mps_daemon: Literal["auto", "per-gpu", "host"] = "auto"
    # The per-GPU daemons' directories (`<gpu>/pipe`, `<gpu>/log`; `<gpu>`: the UUID's first 8
    # hex digits); default: `mps` in the agent's state directory. Short: sockets live there.
    mps_dir: Path | None = None
    # How long the control program may take to start or quit a daemon.
    mps_control_timeout_s: float = Field(default=30.0, gt=0)
