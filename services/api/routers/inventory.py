"""/v1/nodes, /v1/queues and /v1/cluster: the cluster as the read models see it."""

from __future__ import annotations

from fastapi import APIRouter

from core.queue_rules import queue_owner
from services.api.deps import Caller, Models
from services.api.models import ClusterView, NodeList, NodeView, QueueList
from services.api.problems import PROBLEM_RESPONSES, not_found
from services.api.projections.cluster import summarize
from services.api.validation import queue_chain
from services.api.views import cluster_view, node_view, queue_view

router = APIRouter(prefix="/v1", tags=["cluster"], responses=PROBLEM_RESPONSES)


@router.get(
    "/nodes",
    operation_id="listNodes",
    summary="Every node: state, GPUs, allocations (a team sees only its own jobs' allocations)",
)
async def list_nodes(caller: Caller, models: Models) -> NodeList:
    nodes = sorted(models.nodes.values(), key=lambda node: node.id)
    return NodeList(items=[node_view(node, models, caller) for node in nodes])


@router.get("/nodes/{node_id}", operation_id="getNode", summary="One node")
async def get_node(node_id: str, caller: Caller, models: Models) -> NodeView:
    node = models.nodes.get(node_id)
    if node is None:
        raise not_found(f"node {node_id}")
    return node_view(node, models, caller)


@router.get("/queues", operation_id="listQueues", summary="Every queue: quota and usage")
async def list_queues(caller: Caller, models: Models) -> QueueList:
    queues = sorted(models.queues.values(), key=lambda queue: queue.name)
    # A team sees its own queues (its own and those under it that no other team owns), never
    # other teams' names, quotas or counts, also of a team the admin placed under it; the
    # cluster-wide totals are in /v1/cluster.
    visible = [
        q
        for q in queues
        if caller.is_admin or queue_owner(queue_chain(models, q.name), models.teams) == caller.team
    ]
    return QueueList(items=[queue_view(queue, models) for queue in visible])


@router.get("/cluster", operation_id="getCluster", summary="Allocation, fragmentation, pending")
async def get_cluster(caller: Caller, models: Models) -> ClusterView:
    return cluster_view(summarize(models))
