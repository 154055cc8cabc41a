"""How busy each GPU really is: the latest NVML utilization per GPU from the telemetry topic.

Telemetry is never in the log, so this is no read model: it lives in the API process's memory,
fed by its own telemetry consumer, and a sample older than `STALE_S` counts as unknown (a node
that stopped reporting is the inventory's business, not a 0% GPU). The dashboard colours GPUs
by it; the metrics report allocated-and-busy GPUs by team and type from it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from schemas.telemetry import NodeHeartbeat, StepTimeSample

STALE_S = 30.0


@dataclass(slots=True)
class GpuActivity:
    # (node id, GPU index) -> (utilization 0..1, when sampled)
    samples: dict[tuple[str, int], tuple[float, datetime]] = field(default_factory=dict)
    # (node id, GPU index) -> (SM activity 0..1 from NVML GPM, when sampled): only GPUs whose
    # node reports it (Hopper and later, and simulated nodes).
    sm_samples: dict[tuple[str, int], tuple[float, datetime]] = field(default_factory=dict)

    async def observe(self, message: NodeHeartbeat | StepTimeSample) -> None:
        if not isinstance(message, NodeHeartbeat):
            return
        for gpu in message.gpus:
            key = (message.node_id, gpu.index)
            for book, value in (
                (self.samples, gpu.utilization),
                (self.sm_samples, gpu.sm_activity),
            ):
                if value is None:
                    continue
                known = book.get(key)
                if known is None or known[1] <= message.at:  # redelivered old samples lose
                    book[key] = (value / 100, message.at)

    def utilization(self, node_id: str, gpu: int, now: datetime) -> float | None:
        """The GPU's utilization (0..1) if sampled within STALE_S of `now`, else None."""
        return _fresh(self.samples.get((node_id, gpu)), now)

    def sm_activity(self, node_id: str, gpu: int, now: datetime) -> float | None:
        """The share of the GPU's SMs busy (0..1, NVML GPM) if sampled within STALE_S."""
        return _fresh(self.sm_samples.get((node_id, gpu)), now)


def _fresh(sample: tuple[float, datetime] | None, now: datetime) -> float | None:
    if sample is None or now - sample[1] > timedelta(seconds=STALE_S):
        return None
    return sample[0]
