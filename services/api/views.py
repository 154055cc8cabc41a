"""Read-model records to response bodies: the only place that knows both shapes."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Literal
from uuid import UUID

from core.live_sharing import as_number
from schemas.envelope import EventEnvelope
from schemas.jobs import JobSpec, JobState, JobSubmitted
from services.api.auth import Principal
from services.api.models import (
    ArrayView,
    ClusterView,
    EventView,
    GpuView,
    JobView,
    NodeView,
    QueueView,
    ShareView,
    SliceView,
)
from services.api.projections.cluster import ClusterSummary, node_usage
from services.api.projections.jobs import JobReadModel
from services.api.projections.model import ReadModels
from services.api.projections.nodes import NodeRecord
from services.api.projections.queues import QueueRecord


def job_view(job: JobReadModel, seen_by: Principal, jobs: Mapping[str, JobReadModel]) -> JobView:
    """The job as `seen_by` may see it: its reason names no other team's job (`jobs` says
    whose each is)."""
    return JobView(
        id=job.id,
        name=job.spec.name,
        team=job.spec.team,
        queue=job.queue,
        priority=job.priority,
        state=job.state,
        reason=None if job.reason is None else seen_by.words(job.reason, jobs),
        reason_code=job.reason_code,
        estimated_start=job.estimated_start,
        planned_nodes=list(job.planned_nodes),
        placement={node: list(gpus) for node, gpus in sorted(job.placement.items())},
        attempts=job.attempt,
        preemptions=job.preemptions,
        gpus=job.gpus,
        tasks=job.spec.tasks,
        gpus_per_task=job.spec.gpus_per_task,
        requested=sorted(job.requests),
        submitted_at=job.submitted_at,
        submitted_by=job.submitted_by,
        updated_at=job.updated_at,
        finished_at=job.finished_at,
        spec=job.spec,
        held=job.held,
        array_id=job.array_id,
        array_index=job.array_index,
    )


# An array's state is that of its most advanced elements: running while any runs, waiting
# while any waits, and ended (failed over cancelled over succeeded) once all have.
_ARRAY_STATE_ORDER: tuple[JobState, ...] = (
    "preempting",
    "running",
    "reserved",
    "queued",
    "pending",
    "suspended",
    "failed",
    "cancelled",
    "rejected",
    "succeeded",
)


def array_view(
    array_id: str,
    jobs: list[JobReadModel],
    seen_by: Principal,
    known: Mapping[str, JobReadModel],
) -> ArrayView:
    # By index, not in the order this process happened to learn the elements in.
    jobs = sorted(jobs, key=lambda job: (job.array_index is None, job.array_index or 0, job.id))
    first = jobs[0]
    states = Counter(job.state for job in jobs)
    state = next(s for s in _ARRAY_STATE_ORDER if states[s])
    array = first.spec.array
    return ArrayView(
        id=array_id,
        name=first.spec.name,
        team=first.spec.team,
        state=state,
        count=len(jobs) if array is None else array.count,
        max_parallel=None if array is None else array.max_parallel,
        array=[job.id for job in jobs],
        states=dict(sorted(states.items())),
        elements=[job_view(job, seen_by, known) for job in jobs],
    )


def node_view(node: NodeRecord, models: ReadModels, principal: Principal) -> NodeView:
    held = models.allocated_on(node.id)
    exact, allocated = node_usage(node, models)
    healthy = node.healthy_gpus
    visible_jobs = {
        job_id: list(gpus)
        for job_id, gpus in sorted(held.items())
        if principal.is_admin or (job_id in models.jobs and principal.can_see(models.jobs[job_id]))
    }
    return NodeView(
        id=node.id,
        hostname=node.hostname,
        gpu_type=node.gpu_type,
        rack=node.rack,
        block=node.block,
        nvlink_domain=node.nvlink_domain,
        nvlink=node.nvlink,
        state=node.state,
        gpus=len(node.gpu_indices),
        healthy_gpus=len(healthy),
        allocated_gpus=as_number(exact),
        free_gpus=sum(1 for gpu in healthy if gpu not in allocated),
        unhealthy_gpu_indices=sorted(node.unhealthy_gpus),
        degraded_signals=list(node.degraded),
        # A straggler's reason names its job: another team's id is not the viewer's to read.
        reason=None if node.reason is None else principal.words(node.reason, models.jobs),
        labels=dict(node.labels),
        jobs=visible_jobs,
        gpu_model=node.gpu_model,
        mig=node.mig if node.mig in ("none", "dynamic", "fixed") else "none",
        gpu_details=gpu_views(node, models, principal),
    )


def gpu_views(node: NodeRecord, models: ReadModels, principal: Principal) -> list[GpuView]:
    """Each GPU's geometry and what runs in each slice or share (job ids a team may see)."""

    def shown(job_id: str) -> str | None:
        job = models.jobs.get(job_id)
        visible = principal.is_admin or (job is not None and principal.can_see(job))
        return job_id if visible else None

    whole: dict[int, str] = {}
    slices: dict[tuple[int, int], str] = {}
    shares: dict[int, list[ShareView]] = {}
    for job_id in sorted(models.allocated_on(node.id)):
        job = models.jobs.get(job_id)
        if job is None:
            continue
        placed = [r for r in job.ranks if r.node_id == node.id]
        if not placed:
            whole.update({gpu: job_id for gpu in models.allocated_on(node.id)[job_id]})
        for rank in placed:
            if rank.mig is not None and rank.gpus:
                slices[(rank.gpus[0], rank.mig.start)] = job_id
            elif rank.share is not None and rank.gpus:
                shares.setdefault(rank.gpus[0], []).append(
                    ShareView(
                        job=shown(job_id),
                        thousandths=rank.share.thousandths,
                        memory_mb=rank.share.memory_mb,
                        sharing=rank.share.sharing,
                    )
                )
            else:
                whole.update({gpu: job_id for gpu in rank.gpus})
    views: list[GpuView] = []
    for index in node.gpu_indices:
        geometry = [
            SliceView(
                profile=profile,
                start=start,
                free=(index, start) not in slices,
                job=shown(slices[(index, start)]) if (index, start) in slices else None,
            )
            for start, profile in node.geometry.get(index, ())
        ]
        on_gpu = shares.get(index, [])
        mode: Literal["idle", "whole", "mig", "shared", "unhealthy"]
        if index in node.unhealthy_gpus:
            mode = "unhealthy"
        elif geometry:
            mode = "mig"
        elif on_gpu:
            mode = "shared"
        elif index in whole:
            mode = "whole"
        else:
            mode = "idle"
        views.append(
            GpuView(
                index=index,
                mode=mode,
                job=shown(whole[index]) if index in whole else None,
                geometry=geometry,
                shares=on_gpu,
                shared_thousandths=sum(share.thousandths for share in on_gpu),
                reconfiguring_until=node.reconfiguring_until.get(index),
            )
        )
    return views


def subtree(name: str, models: ReadModels) -> list[str]:
    """The queue and every queue below it: a parent adds up its children."""
    children: dict[str | None, list[str]] = {}
    for queue in models.queues.values():
        children.setdefault(queue.parent, []).append(queue.name)
    found = [name]
    for current in found:  # grows as it goes; the API never writes a cycle
        found.extend(c for c in children.get(current, ()) if c not in found)
    return found


def queue_view(queue: QueueRecord, models: ReadModels) -> QueueView:
    names = subtree(queue.name, models)
    exact = sum(max(0, models.allocated_by_queue.get(n, 0)) for n in names)
    allocated = as_number(exact)
    return QueueView(
        name=queue.name,
        parent=queue.parent,
        guaranteed_gpus=queue.guaranteed_gpus,
        max_gpus=queue.max_gpus,
        weight=queue.weight,
        is_team=queue.name in models.teams,
        allocated_gpus=allocated,
        borrowed_gpus=as_number(max(0, exact - queue.guaranteed_gpus)),
        pending_jobs=sum(max(0, models.waiting_by_queue.get(n, 0)) for n in names),
        running_jobs=sum(max(0, models.running_by_queue.get(n, 0)) for n in names),
        max_cpus=queue.max_cpus,
        max_memory_mb=queue.max_memory_mb,
        allocated_cpus=sum(max(0, models.allocated_cpus_by_queue.get(n, 0)) for n in names) / 1000,
        allocated_memory_mb=sum(max(0, models.allocated_memory_by_queue.get(n, 0)) for n in names),
    )


def cluster_view(summary: ClusterSummary) -> ClusterView:
    return ClusterView(
        nodes=summary.nodes,
        nodes_by_state=summary.nodes_by_state,
        total_gpus=summary.total_gpus,
        healthy_gpus=summary.healthy_gpus,
        allocated_gpus=summary.allocated_gpus,
        free_gpus=summary.free_gpus,
        whole_free_nodes=summary.whole_free_nodes,
        fragmentation=summary.fragmentation,
        utilization=(
            round(summary.allocated_gpus / summary.healthy_gpus, 4) if summary.healthy_gpus else 0.0
        ),
        pending_jobs=summary.pending_jobs,
        pending_by_class=summary.pending_by_class,
        running_jobs=summary.holding_jobs,
    )


def _uuid(value: UUID | None) -> str | None:
    return None if value is None else str(value)


def event_view(
    envelope: EventEnvelope, seen_by: Principal, jobs: Mapping[str, JobReadModel]
) -> EventView:
    return EventView(
        position=envelope.position or 0,
        stream=envelope.stream,
        version=envelope.version,
        event_id=str(envelope.event_id),
        type=envelope.type,
        schema_version=envelope.schema_version,
        recorded_at=envelope.recorded_at,
        producer=envelope.producer,
        correlation_id=_uuid(envelope.correlation_id),
        causation_id=_uuid(envelope.causation_id),
        epoch=envelope.epoch,
        payload=seen_by.payload(envelope.payload.model_dump(mode="json"), jobs),
    )


def spec_bytes(spec: JobSpec) -> int:
    """About what the spec weighs in a response: its strings, which are all a body can grow
    (the rest is bounded numbers), and a kilobyte for the view around it."""
    strings = sum(map(len, spec.command)) + sum(len(k) + len(v) for k, v in spec.env.items())
    strings += sum(len(k) + len(v) for k, v in spec.secret_env.items())
    return 1024 + 2 * strings  # escaping may double a string at worst (mostly)


def envelope_bytes(envelope: EventEnvelope) -> int:
    """About what an event weighs in a response beyond a few hundred bytes: a submission's
    spec (the other events' payloads are bounded small)."""
    payload = envelope.payload
    return spec_bytes(payload.spec) if isinstance(payload, JobSubmitted) else 0
