"""All of the API's read models behind one `apply(envelope)`, idempotent and order-checked.

Events reach the API twice over (its own appends, applied at once for read-your-writes, and the
same events from the bus) and the bus orders them only within a stream. So each stream's
version is the idempotency key: version ≤ the last applied is a duplicate, version = last + 1 is
applied, anything further is a gap the feeder fills from the log before retrying.
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from core.admission import AdmissionCatalog
from core.state import rank_host
from core.submit_share import RecentSubmissions
from schemas.base import Event
from schemas.checkpoints import CheckpointCommitted
from schemas.envelope import EventEnvelope
from schemas.jobs import WAITING_STATES, JobEvent, JobSubmitted
from schemas.nodes import NodeEvent
from schemas.teams import QueueConfigured, TeamCreated
from services.api.projections.jobs import JOB_FOLD_TYPES, JobReadModel, evolve_job
from services.api.projections.listing import JobListing
from services.api.projections.nodes import NODE_FOLD_TYPES, NodeRecord, evolve_node
from services.api.projections.queues import QueueRecord, TeamRecord, evolve_queue, evolve_team
from services.api.projections.tenancy import (
    TENANCY_EVENTS,
    AuditIndex,
    Tenancy,
    job_of_stream,
    team_of_stream,
)
from services.api.projections.usage import UsageBook


class Outcome(enum.Enum):
    APPLIED = "applied"
    DUPLICATE = "duplicate"
    GAP = "gap"


@dataclass(slots=True)
class Watermark:
    """The highest position P such that every event at or below P has been applied.

    Positions are gap-free in the log, so the distance from the log's head to P is the lag.
    """

    position: int = 0
    _ahead: set[int] = field(default_factory=set)

    def covers(self, position: int) -> bool:
        """Whether the event at `position` has been applied."""
        return position <= self.position or position in self._ahead

    def mark(self, position: int) -> None:
        if position <= self.position:
            return
        self._ahead.add(position)
        while self.position + 1 in self._ahead:
            self.position += 1
            self._ahead.remove(self.position)


@dataclass(slots=True)
class ReadModels:
    jobs: dict[str, JobReadModel] = field(default_factory=dict)
    nodes: dict[str, NodeRecord] = field(default_factory=dict)
    queues: dict[str, QueueRecord] = field(default_factory=dict)
    teams: dict[str, TeamRecord] = field(default_factory=dict)
    team_by_token_sha256: dict[str, str] = field(default_factory=dict)
    # node id -> job id -> GPU indices held there by the job's current gang.
    allocations: dict[str, dict[str, tuple[int, ...]]] = field(default_factory=dict)
    # Exact: slices and shares count their fraction of a GPU (core/live_sharing.py).
    allocated_by_queue: Counter[str] = field(default_factory=Counter)
    # CPUs (thousandths) and memory (MB) the queue's gangs hold, for its host ceilings.
    allocated_cpus_by_queue: Counter[str] = field(default_factory=Counter)
    allocated_memory_by_queue: Counter[str] = field(default_factory=Counter)
    waiting_by_class: Counter[str] = field(default_factory=Counter)
    waiting_by_queue: Counter[str] = field(default_factory=Counter)
    running_by_queue: Counter[str] = field(default_factory=Counter)
    waiting_by_team: Counter[str] = field(default_factory=Counter)
    # Each team's jobs submitted in the last second, by their recorded times: the submit
    # path's fair share among teams (core/submit_share.py), the same in every API worker.
    recent_submissions: RecentSubmissions = field(default_factory=RecentSubmissions)
    # array id -> its elements' job ids, by index.
    arrays: dict[str, list[str]] = field(default_factory=dict)
    # The jobs by team and state in submission order, for GET /v1/jobs's pages.
    listing: JobListing = field(default_factory=JobListing)
    tenancy: Tenancy = field(default_factory=Tenancy)
    audit: AuditIndex = field(default_factory=AuditIndex)
    usage: UsageBook = field(default_factory=UsageBook)
    # Admission's own catalogue, folded from the same events, so the API judges what no wait
    # can fix with admission's rules (services/api/capacity.py) rather than a copy of them.
    admission: AdmissionCatalog = field(default_factory=AdmissionCatalog)
    stream_versions: dict[str, int] = field(default_factory=dict)
    watermark: Watermark = field(default_factory=Watermark)
    events_applied: int = 0

    def version_of(self, stream: str) -> int:
        return self.stream_versions.get(stream, 0)

    def apply(self, envelope: EventEnvelope) -> Outcome:
        known = self.stream_versions.get(envelope.stream, 0)
        if envelope.version <= known:
            return Outcome.DUPLICATE
        if envelope.version > known + 1:
            return Outcome.GAP
        self.stream_versions[envelope.stream] = envelope.version
        position = envelope.position or 0
        if position:
            self.watermark.mark(position)
        self._fold(envelope.payload, envelope, position)
        if position:
            self._index(envelope.stream, position)
        self.events_applied += 1
        return Outcome.APPLIED

    def apply_all(self, envelopes: Iterable[EventEnvelope]) -> list[Outcome]:
        return [self.apply(envelope) for envelope in envelopes]

    def _fold(self, event: Event, envelope: EventEnvelope, position: int) -> None:
        handler = _MODEL_FOLDS.get(type(event))
        if handler is not None:
            handler(self, event, envelope.recorded_at, position)
        self.admission.apply(event)

    def _fold_job(self, event: JobEvent, at: datetime, position: int) -> None:
        before = self.jobs.get(event.job_id)
        after = evolve_job(before, event, at=at, position=position)
        if after is not None and after is not before:
            self.jobs[after.id] = after
            self._reindex_job(before, after)
            self.listing.update(before, after)
            if before is None and after.array_id is not None:
                self.arrays.setdefault(after.array_id, []).append(after.id)
            if before is None and isinstance(event, JobSubmitted):
                self.recent_submissions.add(event.spec.team, at.timestamp())
            self.usage.observe(before, after, at, self._gpu_type_of)

    def _fold_checkpoint(self, event: CheckpointCommitted, at: datetime, position: int) -> None:
        self.usage.checkpointed(event.job_id, event.attempt, at)

    def _gpu_type_of(self, node_id: str) -> str | None:
        node = self.nodes.get(node_id)
        return None if node is None else node.gpu_type

    def _fold_node(self, event: NodeEvent, at: datetime, position: int) -> None:
        node = evolve_node(self.nodes.get(event.node_id), event, at=at)
        if node is not None:
            self.nodes[node.id] = node

    def _fold_tenancy(self, event: Event, at: datetime, position: int) -> None:
        self.tenancy.apply(event)

    def _fold_queue(self, event: TeamCreated | QueueConfigured, at: datetime) -> None:
        queue = evolve_queue(self.queues.get(event.name), event, at=at)
        if queue is not None:
            self.queues[queue.name] = queue

    def _fold_team_created(self, event: TeamCreated, at: datetime, position: int) -> None:
        # A team's creation feeds three models: its tokens, its default queue, the team itself.
        self.tenancy.apply(event)
        self._fold_queue(event, at)
        team = evolve_team(self.teams.get(event.name), event, at=at)
        if team is not None:
            self.teams[team.name] = team
            self.team_by_token_sha256[team.token_sha256] = team.name

    def _fold_queue_configured(self, event: QueueConfigured, at: datetime, position: int) -> None:
        self._fold_queue(event, at)

    def _index(self, stream: str, position: int) -> None:
        """Record the position under the team it belongs to, for that team's audit reads."""
        job_id = job_of_stream(stream)
        if job_id is not None:
            job = self.jobs.get(job_id)
            self.audit.add_for_job(job_id, None if job is None else job.spec.team, position)
            return
        team = team_of_stream(stream)
        if team is not None:
            self.audit.add(team, position)

    def _reindex_job(self, before: JobReadModel | None, after: JobReadModel) -> None:
        """Keep the aggregate indexes (allocations, per-queue and per-class counts) in step."""
        if before is not None:
            self._count(before, -1)
            for node in before.placement:
                held = self.allocations.get(node)
                if held is not None:
                    held.pop(before.id, None)
                    if not held:
                        del self.allocations[node]
        self._count(after, +1)
        for node, gpus in after.placement.items():
            self.allocations.setdefault(node, {})[after.id] = gpus

    def _count(self, job: JobReadModel, sign: int) -> None:
        if job.holds_gpus:
            # A Counter adds Fractions exactly as well as ints (its type says int only).
            self.allocated_by_queue[job.queue] += sign * job.held_gpus  # type: ignore[assignment]
            cpus_milli, memory_mb = rank_host(job.spec)
            if cpus_milli or memory_mb:
                ranks = len(job.gang_ranks)
                self.allocated_cpus_by_queue[job.queue] += sign * cpus_milli * ranks
                self.allocated_memory_by_queue[job.queue] += sign * memory_mb * ranks
            self.running_by_queue[job.queue] += sign
        elif job.state in WAITING_STATES:
            self.waiting_by_class[job.priority] += sign
            self.waiting_by_queue[job.queue] += sign
            self.waiting_by_team[job.spec.team] += sign

    def allocated_on(self, node_id: str) -> Mapping[str, tuple[int, ...]]:
        return self.allocations.get(node_id, {})


# The dispatch table: each event class the read models read, and which of them it feeds.
_MODEL_FOLDS: dict[type[Event], Callable[[ReadModels, Any, datetime, int], None]] = {
    **{event_class: ReadModels._fold_job for event_class in JOB_FOLD_TYPES},
    **{event_class: ReadModels._fold_node for event_class in NODE_FOLD_TYPES},
    **{event_class: ReadModels._fold_tenancy for event_class in TENANCY_EVENTS},
    # Written after the tenancy entries on purpose: a team's creation feeds more than tenancy.
    TeamCreated: ReadModels._fold_team_created,
    QueueConfigured: ReadModels._fold_queue_configured,
    CheckpointCommitted: ReadModels._fold_checkpoint,
}
