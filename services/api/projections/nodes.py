"""The node read model: inventory and health of each node, folded from its stream."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime
from typing import Final, Literal

from schemas.base import Event
from schemas.nodes import (
    GpuRecovered,
    GpuUnhealthy,
    NodeDegraded,
    NodeDrained,
    NodeDrainRequested,
    NodeLost,
    NodeRecovered,
    NodeRegistered,
    NodeUndrained,
)

NodeState = Literal["ready", "degraded", "draining", "drained", "lost"]
# Nodes whose healthy GPUs may take new gangs.
SCHEDULABLE_STATES: Final[frozenset[NodeState]] = frozenset({"ready", "degraded"})


@dataclass(frozen=True, slots=True)
class NodeRecord:
    id: str
    hostname: str
    gpu_type: str
    gpu_indices: tuple[int, ...]
    rack: str
    block: str
    nvlink_domain: str
    labels: tuple[tuple[str, str], ...]
    registered_at: datetime
    updated_at: datetime
    lost: bool = False
    draining: bool = False
    drained: bool = False
    degraded: tuple[str, ...] = ()
    unhealthy_gpus: frozenset[int] = frozenset()
    reason: str | None = None

    @property
    def state(self) -> NodeState:
        if self.lost:
            return "lost"
        if self.drained:
            return "drained"
        if self.draining:
            return "draining"
        if self.degraded:
            return "degraded"
        return "ready"

    @property
    def schedulable(self) -> bool:
        return self.state in SCHEDULABLE_STATES

    @property
    def healthy_gpus(self) -> tuple[int, ...]:
        """GPUs that could take work now: none on a lost, draining or drained node."""
        if not self.schedulable:
            return ()
        return tuple(index for index in self.gpu_indices if index not in self.unhealthy_gpus)


def evolve_node(node: NodeRecord | None, event: Event, *, at: datetime) -> NodeRecord | None:
    """The record after `event`; None while the node's NodeRegistered has not been seen."""
    if isinstance(event, NodeRegistered):
        registered = NodeRecord(
            id=event.node_id,
            hostname=event.hostname,
            gpu_type=event.gpu_type,
            gpu_indices=tuple(sorted(gpu.index for gpu in event.gpus)),
            rack=event.rack,
            block=event.block,
            nvlink_domain=event.nvlink_domain or event.node_id,
            labels=tuple(sorted(event.labels.items())),
            registered_at=node.registered_at if node else at,
            updated_at=at,
        )
        # Re-registration refreshes the inventory but keeps what operators decided (drains).
        if node is not None:
            registered = replace(registered, draining=node.draining, drained=node.drained)
        return registered
    if node is None:
        return None
    match event:
        case NodeLost(reason=reason):
            return replace(node, lost=True, reason=reason, updated_at=at)
        case NodeRecovered():
            return replace(node, lost=False, degraded=(), reason=None, updated_at=at)
        case NodeDegraded(signal=signal, detail=detail):
            signals = tuple(sorted({*node.degraded, signal}))
            return replace(node, degraded=signals, reason=detail, updated_at=at)
        case NodeDrainRequested(reason=reason):
            return replace(node, draining=True, reason=reason, updated_at=at)
        case NodeDrained():
            return replace(node, draining=False, drained=True, updated_at=at)
        case NodeUndrained():
            return replace(
                node, draining=False, drained=False, degraded=(), reason=None, updated_at=at
            )
        case GpuUnhealthy(gpu_index=index, reason=reason):
            return replace(
                node, unhealthy_gpus=node.unhealthy_gpus | {index}, reason=reason, updated_at=at
            )
        case GpuRecovered(gpu_index=index):
            return replace(node, unhealthy_gpus=node.unhealthy_gpus - {index}, updated_at=at)
    return node
