"""What the log already says about node health, so a restarted health service does not record
the same GPU failure or drain twice (its HealthMonitor starts from nothing)."""

from __future__ import annotations

from dataclasses import dataclass, field

from schemas.base import Event
from schemas.nodes import (
    GpuRecovered,
    GpuUnhealthy,
    NodeDegraded,
    NodeDrainRequested,
    NodeUndrained,
)

FACT_TYPES = ("GpuUnhealthy", "GpuRecovered", "NodeDegraded", "NodeDrainRequested", "NodeUndrained")


@dataclass
class HealthFacts:
    unhealthy_gpus: set[tuple[str, int]] = field(default_factory=set)
    degraded: set[tuple[str, str, int | None]] = field(default_factory=set)
    draining: set[str] = field(default_factory=set)

    def fold(self, event: Event) -> None:
        if isinstance(event, GpuUnhealthy):
            self.unhealthy_gpus.add((event.node_id, event.gpu_index))
        elif isinstance(event, GpuRecovered):
            self.unhealthy_gpus.discard((event.node_id, event.gpu_index))
            gpu = (event.node_id, event.gpu_index)
            self.degraded = {d for d in self.degraded if (d[0], d[2]) != gpu}
        elif isinstance(event, NodeDegraded):
            self.degraded.add((event.node_id, event.signal, event.gpu_index))
        elif isinstance(event, NodeDrainRequested):
            self.draining.add(event.node_id)
        elif isinstance(event, NodeUndrained):
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
