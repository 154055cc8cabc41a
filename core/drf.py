"""Dominant-resource fair share (DRF, Ghodsi et al., NSDI'11) over GPUs, CPUs and memory.

A queue's share of each resource is its (time-decayed) usage over what the schedulable fleet
offers; its dominant share is the largest. Fair share orders queues by it, so a team that
fills the CPUs with preprocessing is as far ahead as one that fills the GPUs with training.

Quotas (guarantees and ceilings) stay in GPUs, as the queue contract states them; the dominant
share is expressed in GPU-equivalents (a share s of the fleet's CPUs counts as s x its GPUs),
so that it divides by a guarantee in GPUs as the GPU-only share did, and reduces to it exactly
where no node declares CPUs or memory.
"""

from __future__ import annotations

from core.state import HostCapacity, QueueRecord, decayed_usage


def dominant_usage(
    queue: QueueRecord, now: float, half_life_s: float, capacity: HostCapacity | None
) -> float:
    """The queue's decayed usage of its dominant resource, in GPU-seconds-equivalent."""
    elapsed = now - queue.usage_at
    gpus = decayed_usage(queue.decayed_usage, queue.allocated, elapsed, half_life_s)
    if capacity is None or capacity.gpus <= 0:
        return gpus
    dominant = gpus
    if capacity.cpus_milli > 0 and (queue.allocated_cpus_milli or queue.decayed_cpu_usage):
        cpus = decayed_usage(
            queue.decayed_cpu_usage, queue.allocated_cpus_milli, elapsed, half_life_s
        )
        dominant = max(dominant, cpus * capacity.gpus / capacity.cpus_milli)
    if capacity.memory_mb > 0 and (queue.allocated_memory_mb or queue.decayed_memory_usage):
        memory = decayed_usage(
            queue.decayed_memory_usage, queue.allocated_memory_mb, elapsed, half_life_s
        )
        dominant = max(dominant, memory * capacity.gpus / capacity.memory_mb)
    return dominant


def dominant_shares(queue: QueueRecord, capacity: HostCapacity) -> dict[str, float]:
    """The queue's current share of each resource of the fleet (what it holds now)."""
    return {
        "gpus": float(queue.allocated) / capacity.gpus if capacity.gpus else 0.0,
        "cpus": queue.allocated_cpus_milli / capacity.cpus_milli if capacity.cpus_milli else 0.0,
        "memory": queue.allocated_memory_mb / capacity.memory_mb if capacity.memory_mb else 0.0,
    }
