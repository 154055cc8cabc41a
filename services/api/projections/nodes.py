"""The node read model: inventory and health of each node, folded from its stream."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any, Final, Literal

from core.mig import mig_model, pack
from schemas.base import Event
from schemas.nodes import (
    GpuGeometryChanged,
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
    # The GPU model (its MIG profile table), when the node declared one.
    gpu_model: str | None = None
    # How its GPUs may be partitioned (none, dynamic, fixed), and each GPU's MIG geometry:
    # GPU index → (start slot, profile) of its instances; absent: a whole GPU.
    mig: str = "none"
    nvlink: bool = True
    geometry: Mapping[int, tuple[tuple[int, str], ...]] = field(default_factory=dict)
    # GPUs being re-partitioned: they serve nothing until then.
    reconfiguring_until: Mapping[int, datetime] = field(default_factory=dict)

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
    fold = _NODE_FOLDS.get(type(event))
    return node if fold is None else fold(node, event, at)


# A fold of the table: (record or None, event, recorded at) -> record or None.
_Fold = Callable[[NodeRecord | None, Any, datetime], NodeRecord | None]
# A fold of a registered node's record.
_KnownFold = Callable[[NodeRecord, Any, datetime], NodeRecord]


def _on_registered(node: NodeRecord | None, event: NodeRegistered, at: datetime) -> NodeRecord:
    registered = NodeRecord(
        id=event.node_id,
        hostname=event.hostname,
        gpu_type=event.gpu_type,
        gpu_model=event.gpu_model,
        gpu_indices=tuple(sorted(gpu.index for gpu in event.gpus)),
        rack=event.rack,
        block=event.block,
        nvlink_domain=event.nvlink_domain or event.node_id,
        labels=tuple(sorted(event.labels.items())),
        registered_at=node.registered_at if node else at,
        updated_at=at,
        mig=event.mig,
        geometry=_fixed_geometry(event),
        nvlink=event.nvlink,
    )
    # Re-registration refreshes the inventory but keeps what operators decided (drains) and
    # the geometries the scheduler set.
    if node is not None:
        registered = replace(registered, draining=node.draining, drained=node.drained)
        if event.mig == "dynamic":
            registered = replace(
                registered,
                geometry=node.geometry,
                reconfiguring_until=node.reconfiguring_until,
            )
    return registered


def _fixed_geometry(event: NodeRegistered) -> dict[int, tuple[tuple[int, str], ...]]:
    """A fixed MIG geometry as the scheduler's ledger packs it (core/mig.py), on every GPU."""
    if event.mig != "fixed":
        return {}
    model = mig_model(event.gpu_model or event.gpu_type)
    packed = pack(model, event.mig_profiles) if model is not None else None
    if not packed:
        return {}
    instances = tuple((i.start, i.profile) for i in packed)
    return {gpu.index: instances for gpu in event.gpus}


def _on_geometry_changed(node: NodeRecord, event: GpuGeometryChanged, at: datetime) -> NodeRecord:
    geometry = dict(node.geometry)
    instances = tuple(sorted((i.start, i.profile) for i in event.geometry))
    if instances:
        geometry[event.gpu_index] = instances
    else:
        geometry.pop(event.gpu_index, None)
    busy = dict(node.reconfiguring_until)
    busy[event.gpu_index] = at + timedelta(seconds=event.reconfigure_s)
    return replace(node, geometry=geometry, reconfiguring_until=busy, updated_at=at)


def _known(fold: _KnownFold) -> _Fold:
    """`fold` applied to a registered node only: before its NodeRegistered there is no record."""

    def folded(node: NodeRecord | None, event: Event, at: datetime) -> NodeRecord | None:
        return None if node is None else fold(node, event, at)

    return folded


def _on_lost(node: NodeRecord, event: NodeLost, at: datetime) -> NodeRecord:
    return replace(node, lost=True, reason=event.reason, updated_at=at)


def _on_recovered(node: NodeRecord, event: NodeRecovered, at: datetime) -> NodeRecord:
    return replace(node, lost=False, degraded=(), reason=None, updated_at=at)


def _on_degraded(node: NodeRecord, event: NodeDegraded, at: datetime) -> NodeRecord:
    signals = tuple(sorted({*node.degraded, event.signal}))
    return replace(node, degraded=signals, reason=event.detail, updated_at=at)


def _on_drain_requested(node: NodeRecord, event: NodeDrainRequested, at: datetime) -> NodeRecord:
    return replace(node, draining=True, reason=event.reason, updated_at=at)


def _on_drained(node: NodeRecord, event: NodeDrained, at: datetime) -> NodeRecord:
    return replace(node, draining=False, drained=True, updated_at=at)


def _on_undrained(node: NodeRecord, event: NodeUndrained, at: datetime) -> NodeRecord:
    return replace(node, draining=False, drained=False, degraded=(), reason=None, updated_at=at)


def _on_gpu_unhealthy(node: NodeRecord, event: GpuUnhealthy, at: datetime) -> NodeRecord:
    unhealthy = node.unhealthy_gpus | {event.gpu_index}
    return replace(node, unhealthy_gpus=unhealthy, reason=event.reason, updated_at=at)


def _on_gpu_recovered(node: NodeRecord, event: GpuRecovered, at: datetime) -> NodeRecord:
    return replace(node, unhealthy_gpus=node.unhealthy_gpus - {event.gpu_index}, updated_at=at)


# The fold's dispatch table: each event class of a node's stream the read model reads.
_NODE_FOLDS: dict[type[Event], _Fold] = {
    NodeRegistered: _on_registered,
    NodeLost: _known(_on_lost),
    NodeRecovered: _known(_on_recovered),
    NodeDegraded: _known(_on_degraded),
    NodeDrainRequested: _known(_on_drain_requested),
    NodeDrained: _known(_on_drained),
    NodeUndrained: _known(_on_undrained),
    GpuUnhealthy: _known(_on_gpu_unhealthy),
    GpuRecovered: _known(_on_gpu_recovered),
    GpuGeometryChanged: _known(_on_geometry_changed),
}
# The event classes the node read model folds (the model routes only these to `evolve_node`).
NODE_FOLD_TYPES: tuple[type[Event], ...] = tuple(_NODE_FOLDS)
