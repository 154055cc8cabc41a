"""What the log already says about node health, so a restarted health service does not record
the same GPU failure or drain twice (its HealthMonitor starts from nothing)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from schemas.base import Event
from schemas.nodes import (
    GpuRecovered,
    GpuUnhealthy,
    NodeDegraded,
    NodeDrainRequested,
    NodeUndrained,
)


@dataclass
class HealthFacts:
    unhealthy_gpus: set[tuple[str, int]] = field(default_factory=set)
    degraded: set[tuple[str, str, int | None]] = field(default_factory=set)
    draining: set[str] = field(default_factory=set)

    def fold(self, event: Event) -> None:
        handler = _FOLDS.get(type(event))
        if handler is not None:
            handler(self, event)

    def _on_gpu_unhealthy(self, event: GpuUnhealthy) -> None:
        self.unhealthy_gpus.add((event.node_id, event.gpu_index))

    def _on_gpu_recovered(self, event: GpuRecovered) -> None:
        self.unhealthy_gpus.discard((event.node_id, event.gpu_index))
        gpu = (event.node_id, event.gpu_index)
        self.degraded = {d for d in self.degraded if (d[0], d[2]) != gpu}

    def _on_node_degraded(self, event: NodeDegraded) -> None:
        self.degraded.add((event.node_id, event.signal, event.gpu_index))

    def _on_drain_requested(self, event: NodeDrainRequested) -> None:
        self.draining.add(event.node_id)

    def _on_undrained(self, event: NodeUndrained) -> None:
        self.draining.discard(event.node_id)
        self.degraded = {d for d in self.degraded if d[0] != event.node_id}

    def is_new(self, event: Event) -> bool:
        """False when the log already holds this fact (and nothing has undone it since)."""
        if isinstance(event, GpuUnhealthy):
            return (event.node_id, event.gpu_index) not in self.unhealthy_gpus
        if isinstance(event, NodeDegraded):
            return (event.node_id, event.signal, event.gpu_index) not in self.degraded
        if isinstance(event, NodeDrainRequested):
            return event.node_id not in self.draining
        if isinstance(event, GpuRecovered):
            return (event.node_id, event.gpu_index) in self.unhealthy_gpus
        if isinstance(event, NodeUndrained):
            return event.node_id in self.draining
        return True


# The dispatch table: each fact-bearing event class and how it is folded.
_FOLDS: dict[type[Event], Callable[[HealthFacts, Any], None]] = {
    GpuUnhealthy: HealthFacts._on_gpu_unhealthy,
    GpuRecovered: HealthFacts._on_gpu_recovered,
    NodeDegraded: HealthFacts._on_node_degraded,
    NodeDrainRequested: HealthFacts._on_drain_requested,
    NodeUndrained: HealthFacts._on_undrained,
}
FACT_TYPES = tuple(event_class.type for event_class in _FOLDS)
