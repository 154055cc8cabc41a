"""What the per-job controller decides, as pure functions of the job's events.

The agent consults the job's stream before acting, so a redelivered or stale GangReserved
(already started, or already released) starts nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from schemas.base import Event
from schemas.checkpoints import CheckpointCommitted, CheckpointCorrupted
from schemas.jobs import (
    GANG_RELEASING_EVENTS,
    GangReserved,
    JobSpec,
    JobSubmitted,
    RankPlacement,
    TaskExited,
    TaskStarted,
)
from services.agent.devices import GpuUuids, MigUuids, device_env

# The env a rank inherits from the agent, whatever the job sets: enough to find its program.
INHERITED_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "TZ", "TMPDIR", "USER", "VIRTUAL_ENV")
# A job that sets this in its env handles SIGUSR1 by writing its shard (see services/checkpoint).
CHECKPOINT_SIGNAL_ENV = "GANGWAY_CHECKPOINT_SIGNAL"


@dataclass
class AgentJob:
    """A job as its stream tells it to the agent."""

    spec: JobSpec | None = None
    # An array element's index: its ranks get GANGWAY_ARRAY_INDEX.
    array_index: int | None = None
    gangs: dict[int, GangReserved] = field(default_factory=dict)
    started: set[tuple[int, int]] = field(default_factory=set)  # (attempt, rank)
    exited: set[tuple[int, int]] = field(default_factory=set)
    released: set[int] = field(default_factory=set)  # attempts whose gang was released
    terminal: bool = False


def fold_job(events: Iterable[Event]) -> AgentJob:
    view = AgentJob()
    for event in events:
        handler = _JOB_FOLDS.get(type(event))
        if handler is not None:
            handler(view, event)
    return view


def _on_submitted(view: AgentJob, event: JobSubmitted) -> None:
    view.spec = event.spec
    view.array_index = event.array_index


def _on_gang_reserved(view: AgentJob, event: GangReserved) -> None:
    view.gangs[event.attempt] = event


def _on_task_started(view: AgentJob, event: TaskStarted) -> None:
    view.started.add((event.attempt, event.rank))


def _on_task_exited(view: AgentJob, event: TaskExited) -> None:
    view.exited.add((event.attempt, event.rank))


def _on_gang_released(view: AgentJob, event: Event) -> None:
    attempt = getattr(event, "attempt", None)
    if attempt is None:
        # Cancelled / suspended / failed outside an attempt: every gang so far is gone.
        view.released.update(view.gangs)
    else:
        view.released.add(attempt)
    if event.type in ("JobSucceeded", "JobFailed", "JobCancelled"):
        view.terminal = True


# The fold's dispatch table: each event class of a job's stream the agent cares about.
_JOB_FOLDS: dict[type[Event], Callable[[AgentJob, Any], None]] = {
    JobSubmitted: _on_submitted,
    GangReserved: _on_gang_reserved,
    TaskStarted: _on_task_started,
    TaskExited: _on_task_exited,
    **{released: _on_gang_released for released in GANG_RELEASING_EVENTS},
}


def ranks_to_launch(
    view: AgentJob,
    reserved: GangReserved,
    nodes: Iterable[str],
    launched: set[tuple[str, int, int]],
) -> list[RankPlacement]:
    """The ranks of `reserved` this agent must start: on its nodes, never started before, of
    an attempt that still holds its gang."""
    if reserved.attempt in view.released or view.terminal:
        return []
    ours = set(nodes)
    return [
        placement
        for placement in reserved.ranks
        if placement.node_id in ours
        and (reserved.attempt, placement.rank) not in view.started
        and (reserved.job_id, reserved.attempt, placement.rank) not in launched
    ]


def latest_checkpoint(events: Iterable[Event]) -> CheckpointCommitted | None:
    committed = committed_newest_first(events)
    return committed[0] if committed else None


def committed_newest_first(events: Iterable[Event]) -> list[CheckpointCommitted]:
    """The committed checkpoints a job may resume from, newest first: those later found
    corrupted are left out."""
    committed: list[CheckpointCommitted] = []
    corrupted: set[str] = set()
    for event in events:
        if isinstance(event, CheckpointCommitted):
            committed.append(event)
        elif isinstance(event, CheckpointCorrupted):
            corrupted.add(event.checkpoint_id)
    return [c for c in reversed(committed) if c.checkpoint_id not in corrupted]


def launch_failure(node_id: str, rank: int, error: BaseException) -> tuple[str, bool]:
    """Why a rank could not start, worded for a person, and whether trying again would fail
    the same way (a bad spec, a missing or non-executable program: permanent) or might not
    (out of memory or processes for a moment: transient)."""
    where = f"launch failed on {node_id} rank {rank}"
    if isinstance(error, FileNotFoundError | PermissionError | NotADirectoryError):
        # One raised with a message only (the agent's own "no such program: X") has neither
        # strerror nor filename: its message says it, not its class name.
        what = error.strerror or str(error) or type(error).__name__
        name = f": {error.filename}" if error.filename else ""
        return f"{where}: {what}{name}", True
    if isinstance(error, OSError):
        return f"{where}: {error.strerror or error}", False
    if isinstance(error, ValueError | TypeError):
        return f"{where}: {error}", True
    return f"{where}: {type(error).__name__}: {error}", False


def rank_env(
    *,
    spec: JobSpec,
    job_id: str,
    attempt: int,
    placement: RankPlacement,
    world_size: int,
    checkpoint_dir: Path | None,
    checkpoint_request: Path,
    agent_env: Mapping[str, str],
    step_file: Path | None = None,
    gpu_memory_mb: Mapping[int, int] | None = None,
    mig_uuids: MigUuids | None = None,
    gpu_uuids: GpuUuids | None = None,
    checkpoint_interval_s: float | None = None,
) -> dict[str, str]:
    """The rank's environment: a few of the agent's variables, the job's env, then Gangway's
    (which the job cannot override: they describe the placement).

    GANGWAY_CHECKPOINT_INTERVAL_S is the attempt's periodic checkpoint interval as its
    GangReserved records it (the spec's, or the Young-Daly one chosen for `auto`), else the
    spec's number; empty when the job has no periodic checkpoints (a rank that checkpoints
    on its own may pace itself by it)."""
    env = {key: agent_env[key] for key in INHERITED_ENV if key in agent_env}
    # Python's output reaches rank.log (and `gangway logs -f`) as it is printed, not when the
    # rank ends; a job may still ask for buffering in its env.
    env["PYTHONUNBUFFERED"] = "1"
    env.update(spec.env)
    env.update(
        {
            "GANGWAY_JOB_ID": job_id,
            "GANGWAY_RANK": str(placement.rank),
            "GANGWAY_WORLD_SIZE": str(world_size),
            "GANGWAY_ATTEMPT": str(attempt),
            "GANGWAY_NODE_ID": placement.node_id,
            "GANGWAY_CHECKPOINT_DIR": "" if checkpoint_dir is None else str(checkpoint_dir),
            "GANGWAY_CHECKPOINT_REQUEST": str(checkpoint_request),
            "GANGWAY_CHECKPOINT_INTERVAL_S": _interval_text(spec, checkpoint_interval_s),
        }
    )
    if step_file is not None:
        env["GANGWAY_STEP_FILE"] = str(step_file)
    # A slice's MIG device, an MPS share's limits (services/agent/devices.py).
    env.update(
        device_env(
            spec,
            placement,
            gpu_memory_mb=gpu_memory_mb,
            mig_uuids=mig_uuids,
            gpu_uuids=gpu_uuids,
        )
    )
    return env


def _interval_text(spec: JobSpec, recorded: float | None) -> str:
    interval = recorded
    if interval is None and spec.checkpoint.interval_s != "auto":
        interval = spec.checkpoint.interval_s
    return "" if interval is None else f"{interval:.10g}"
