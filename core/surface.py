"""The planning surface: all that the cycle's phases and planners may read of the state.

`SchedulerState` provides it; only `SchedulerState.apply` changes the state. The phases are
typed against this protocol, so mypy refuses a phase that reaches for anything else. The
records it hands out are the state's own (copying them would cost the cycle its speed): read
them, never write them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from typing import Protocol

from core.checkpointing import CheckpointKnowledge
from core.estimates import RuntimeEstimates
from core.live_sharing import LiveSharing
from core.policy import SchedulingPolicy
from core.state import (
    CoreJob,
    EndWatch,
    FreeCapacityWatch,
    HoldingWatch,
    HostCapacity,
    NodeRecord,
    QueueRecord,
    WaitingWatch,
)


class PlanningSurface(Protocol):
    @property
    def policy(self) -> SchedulingPolicy: ...

    @property
    def estimates(self) -> RuntimeEstimates:
        """Runtimes learned from the log (core/estimates.py)."""
        ...

    @property
    def checkpoints(self) -> CheckpointKnowledge:
        """Checkpoint costs and failure rates seen in the log (core/checkpointing.py)."""
        ...

    @property
    def version(self) -> int:
        """Bumped by every fold that could change a decision."""
        ...

    @property
    def node_records(self) -> Sequence[NodeRecord]: ...

    @property
    def sharing(self) -> LiveSharing:
        """MIG geometries, slices and soft shares (core/live_sharing.py)."""
        ...

    def node_record(self, node_id: str) -> NodeRecord | None: ...

    @property
    def job_records(self) -> Mapping[str, CoreJob]: ...

    @property
    def waiting_jobs(self) -> Mapping[str, CoreJob]: ...

    @property
    def latest_retry_at(self) -> float:
        """No waiting job is in its retry backoff at or after this moment."""
        ...

    @property
    def last_rank_started_at(self) -> float:
        """When a rank of any gang last started (-inf: never): the agents hear reservations."""
        ...

    @property
    def holding_jobs(self) -> Mapping[str, CoreJob]: ...

    @property
    def attention(self) -> AbstractSet[str]: ...

    @property
    def draining_nodes(self) -> AbstractSet[int]: ...

    def holding_of(self, queue: str) -> Mapping[str, CoreJob]:
        """The queue's gangs of `holding_jobs`, in its order."""
        ...

    @property
    def preempting_jobs(self) -> Mapping[str, CoreJob]:
        """The gangs of `holding_jobs` being preempted."""
        ...

    @property
    def lingering_nodes(self) -> AbstractSet[int]:
        """Indices of nodes where ranks of released gangs have not exited yet."""
        ...

    @property
    def queue_records(self) -> Mapping[str, QueueRecord]: ...

    @property
    def free_masks(self) -> Mapping[int, int]: ...

    def capacity_profile(self) -> tuple[dict[str, int], dict[str, int]]: ...

    def host_capacity(self) -> HostCapacity: ...

    def watch_free_capacity(self) -> FreeCapacityWatch: ...

    def unwatch_free_capacity(self, watch: FreeCapacityWatch) -> None: ...

    def watch_holding(self) -> HoldingWatch: ...

    def unwatch_holding(self, watch: HoldingWatch) -> None: ...

    def watch_waiting(self) -> WaitingWatch: ...

    def unwatch_waiting(self, watch: WaitingWatch) -> None: ...

    def watch_ends(self) -> EndWatch: ...

    def unwatch_ends(self, watch: EndWatch) -> None: ...
