"""Cluster totals derived from the node and job read models (no state of its own)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from core.live_sharing import GpuAmount, as_number, placement_gpus
from services.api.projections.model import ReadModels
from services.api.projections.nodes import NodeRecord


def node_usage(node: NodeRecord, models: ReadModels) -> tuple[GpuAmount, set[int]]:
    """What the node's gangs hold, exactly (a 1g slice of an H100 counts 1/7), and the GPUs
    that are not free for a whole-GPU gang: held (whole, sliced or shared) or in MIG mode."""
    held: GpuAmount = 0
    busy: set[int] = set(node.geometry)
    for job_id, gpus in models.allocated_on(node.id).items():
        busy.update(gpus)
        job = models.jobs.get(job_id)
        if job is None or not job.ranks:
            held += len(gpus)
            continue
        held += sum((placement_gpus(r) for r in job.ranks if r.node_id == node.id), 0)
    return held, busy


@dataclass(frozen=True, slots=True)
class ClusterSummary:
    nodes: int
    nodes_by_state: dict[str, int]
    total_gpus: int
    healthy_gpus: int
    allocated_gpus: int | float
    free_gpus: int
    whole_free_nodes: int
    # Share of free GPUs that do not sit in a wholly free node: what large gangs cannot use.
    fragmentation: float
    pending_by_class: dict[str, int]
    pending_jobs: int
    holding_jobs: int


def summarize(models: ReadModels) -> ClusterSummary:
    total = healthy = free = free_in_whole_nodes = whole_free_nodes = 0
    allocated: GpuAmount = 0
    by_state: Counter[str] = Counter()
    for node in models.nodes.values():
        by_state[node.state] += 1
        total += len(node.gpu_indices)
        exact, held = node_usage(node, models)
        allocated += exact
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
        allocated_gpus=as_number(allocated),
        free_gpus=free,
        whole_free_nodes=whole_free_nodes,
        fragmentation=round(1 - free_in_whole_nodes / free, 4) if free else 0.0,
        pending_by_class=pending,
        pending_jobs=sum(pending.values()),
        holding_jobs=sum(n for n in models.running_by_queue.values() if n > 0),
    )
