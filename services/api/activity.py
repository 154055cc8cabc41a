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

    async def observe(self, message: NodeHeartbeat | StepTimeSample) -> None:
        if not isinstance(message, NodeHeartbeat):
            return
        for gpu in message.gpus:
            if gpu.utilization is None:
                continue
            key = (message.node_id, gpu.index)
            known = self.samples.get(key)
            if known is None or known[1] <= message.at:  # redelivered old samples lose
                self.samples[key] = (gpu.utilization / 100, message.at)

    def utilization(self, node_id: str, gpu: int, now: datetime) -> float | None:
        """The GPU's utilization (0..1) if sampled within STALE_S of `now`, else None."""
        sample = self.samples.get((node_id, gpu))
        if sample is None or now - sample[1] > timedelta(seconds=STALE_S):
            return None
        return sample[0]
