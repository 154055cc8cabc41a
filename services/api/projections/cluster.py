"""Cluster totals derived from the node and job read models (no state of its own)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from services.api.projections.model import ReadModels


@dataclass(frozen=True, slots=True)
class ClusterSummary:
    nodes: int
    nodes_by_state: dict[str, int]
    total_gpus: int
    healthy_gpus: int
    allocated_gpus: int
    free_gpus: int
    whole_free_nodes: int
    # Share of free GPUs that do not sit in a wholly free node: what large gangs cannot use.
    fragmentation: float
    pending_by_class: dict[str, int]
    pending_jobs: int
    holding_jobs: int


def summarize(models: ReadModels) -> ClusterSummary:
    total = healthy = allocated = free = free_in_whole_nodes = whole_free_nodes = 0
    by_state: Counter[str] = Counter()
    for node in models.nodes.values():
        by_state[node.state] += 1
        total += len(node.gpu_indices)
        held = {gpu for gpus in models.allocated_on(node.id).values() for gpu in gpus}
        allocated += len(held)
        healthy_gpus = node.healthy_gpus
        healthy += len(healthy_gpus)
        node_free = sum(1 for gpu in healthy_gpus if gpu not in held)
        free += node_free
        if node_free and node_free == len(node.gpu_indices):
            whole_free_nodes += 1
            free_in_whole_nodes += node_free
    pending = {cls: n for cls, n in sorted(models.waiting_by_class.items()) if n > 0}
    return ClusterSummary(
        nodes=len(models.nodes),
        nodes_by_state=dict(sorted(by_state.items())),
        total_gpus=total,
        healthy_gpus=healthy,
        allocated_gpus=allocated,
        free_gpus=free,
        whole_free_nodes=whole_free_nodes,
        fragmentation=round(1 - free_in_whole_nodes / free, 4) if free else 0.0,
        pending_by_class=pending,
        pending_jobs=sum(pending.values()),
        holding_jobs=sum(n for n in models.running_by_queue.values() if n > 0),
    )
