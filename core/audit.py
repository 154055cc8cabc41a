"""The auditor: replays any event sequence and checks the invariants of DESIGN §4.

1. A GPU is bound to at most one gang at any time, in the log and on the hardware: a gang is
   given no GPU on which a rank of another attempt still runs (TaskStarted, no TaskExited,
   node not lost since).
2. A gang is bound whole or not at all.
3. Nothing is placed on a drained, lost or unhealthy node or GPU.
4. A team can always reach its guaranteed quota (by reclaiming borrowed capacity).
5. Every submitted job is terminal, or pending with a reason; none is lost.
6. A deposed scheduler's writes are rejected (leader epoch fencing).

It keeps its own small model of the log (it does not trust the scheduler's state) and reports
each violation with the log positions of the events involved.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from core.policy import SchedulingPolicy
from core.shape import ranks_per_unit
from schemas.base import Event
from schemas.jobs import (
    GangReserved,
    JobAdmitted,
    JobCancelled,
    JobDeferred,
    JobEvent,
    JobFailed,
    JobRejected,
    JobRequeued,
    JobResumed,
    JobSpec,
    JobSubmitted,
    JobSucceeded,
    JobSuspended,
    PreemptionRequested,
    ReservationPlanned,
    TaskExited,
    TaskStarted,
)
from schemas.leadership import LeaderElected
from schemas.nodes import (
    GpuRecovered,
    GpuUnhealthy,
    NodeDrained,
    NodeDrainRequested,
    NodeEvent,
    NodeLost,
    NodeRecovered,
    NodeRegistered,
    NodeUndrained,
)
from schemas.reasons import QUOTA_CEILING
from schemas.teams import QueueConfigured, TeamCreated

# Events only the active scheduler writes: these are fenced by the leader epoch.
SCHEDULER_DECISIONS: tuple[type[Event], ...] = (
    GangReserved,
    PreemptionRequested,
    JobRequeued,
    ReservationPlanned,
    JobDeferred,
)
_TERMINAL: tuple[type[Event], ...] = (JobSucceeded, JobFailed, JobCancelled, JobRejected)
# Decisions that make no sense once a job has finished (late task reports are normal).
_NOT_AFTER_END: tuple[type[Event], ...] = (
    *_TERMINAL,
    GangReserved,
    PreemptionRequested,
    JobRequeued,
    JobResumed,
    JobSuspended,
    JobDeferred,
    ReservationPlanned,
    JobAdmitted,
)


@dataclass(frozen=True, slots=True)
class Violation:
    invariant: int
    message: str
    positions: tuple[int, ...]


@dataclass(slots=True)
class _Node:
    gpus: frozenset[int]
    lost: bool = False
    draining: bool = False
    drained: bool = False
    unhealthy: set[int] = field(default_factory=set)


@dataclass(slots=True)
class _Job:
    spec: JobSpec
    submitted_at: int
    queue: str
    terminal_at: int | None = None
    gang: list[tuple[str, int]] = field(default_factory=list)
    # The current attempt's GPUs per rank, to know where its TaskStarted ranks run.
    rank_gpus: dict[int, tuple[int, ...]] = field(default_factory=dict)
    gang_at: int | None = None
    gang_since: float = 0.0
    attempt: int = 0
    waiting: bool = False
    # Whether a reason (JobDeferred, ReservationPlanned) was recorded since it began waiting.
    explained: bool = False
    entitled_since: float | None = None


@dataclass(slots=True)
class _Queue:
    parent: str | None
    guaranteed: int
    at: int


class Auditor:
    """Feed it every event in log order: `observe(event, position, at, epoch)`."""

    def __init__(
        self, policy: SchedulingPolicy | None = None, reclaim_within_s: float = 3600.0
    ) -> None:
        self.violations: list[Violation] = []
        self._policy = policy if policy is not None else SchedulingPolicy()
        # How long a job entitled to its guarantee may wait while reclaimable borrowers run.
        self._reclaim_within_s = reclaim_within_s
        self._nodes: dict[str, _Node] = {}
        self._bound: dict[tuple[str, int], tuple[str, int]] = {}
        # On the hardware: GPU → the rank running on it (TaskStarted, not yet TaskExited, node
        # not lost since), as (job, attempt, rank, position of its TaskStarted).
        self._running: dict[tuple[str, int], tuple[str, int, int, int]] = {}
        self._running_slots: dict[tuple[str, int, int], list[tuple[str, int]]] = {}
        self._jobs: dict[str, _Job] = {}
        self._queues: dict[str, _Queue] = {}
        self._usage: dict[str, int] = {}
        self._epoch = 0
        self._epoch_at: int | None = None
        self._oversubscribed = False
        # GPUs of every registered node, kept as nodes register: summing them on each
        # registration made registering a 12,500-node cluster quadratic.
        self._capacity = 0

    def _flag(self, invariant: int, message: str, *positions: int) -> None:
        self.violations.append(Violation(invariant, message, tuple(positions)))

    def observe(self, event: Event, position: int, at: float, epoch: int | None) -> None:
        self._check_fencing(event, position, epoch)
        if isinstance(event, JobEvent):
            # A job's events are checked as one family: any of them, of a job never
            # submitted, is a violation, whatever its class.
            self._observe_job(event, position, at)
            return
        handler = _AUDIT_FOLDS.get(type(event))
        if handler is not None:
            handler(self, event, position)

    def _on_node_registered(self, event: NodeRegistered, position: int) -> None:
        previous = self._nodes.get(event.node_id)
        if previous is not None:
            self._capacity -= len(previous.gpus)
        self._nodes[event.node_id] = _Node(gpus=frozenset(g.index for g in event.gpus))
        self._capacity += len(self._nodes[event.node_id].gpus)
        self._check_guarantees(position)

    def _on_queue(self, event: TeamCreated | QueueConfigured, position: int) -> None:
        self._queues[event.name] = _Queue(event.parent, event.guaranteed_gpus, position)
        self._check_guarantees(position)

    # ---------------------------------------------------------------- 6

    def _check_fencing(self, event: Event, position: int, epoch: int | None) -> None:
        if isinstance(event, LeaderElected):
            if event.epoch <= self._epoch and self._epoch_at is not None:
                self._flag(
                    6,
                    f"leader epoch {event.epoch} does not exceed epoch {self._epoch}",
                    self._epoch_at,
                    position,
                )
            else:
                self._epoch = event.epoch
                self._epoch_at = position
            return
        if (
            epoch is not None
            and self._epoch_at is not None
            and epoch < self._epoch
            and isinstance(event, SCHEDULER_DECISIONS)
        ):
            self._flag(
                6,
                f"{event.type} written with epoch {epoch} after epoch {self._epoch} "
                "was elected (a deposed scheduler's write)",
                self._epoch_at,
                position,
            )

    # ---------------------------------------------------------------- nodes

    def _on_node_lost(self, node: _Node, event: NodeLost) -> None:
        node.lost = True
        for slot, (job_id, attempt, rank, _) in list(self._running.items()):
            if slot[0] == event.node_id:
                del self._running[slot]
                self._running_slots.pop((job_id, attempt, rank), None)

    def _on_node_recovered(self, node: _Node, event: NodeRecovered) -> None:
        node.lost = False

    def _on_drain_requested(self, node: _Node, event: NodeDrainRequested) -> None:
        node.draining = True

    def _on_drained(self, node: _Node, event: NodeDrained) -> None:
        node.drained, node.draining = True, False

    def _on_undrained(self, node: _Node, event: NodeUndrained) -> None:
        node.drained = node.draining = False

    def _on_gpu_unhealthy(self, node: _Node, event: GpuUnhealthy) -> None:
        node.unhealthy.add(event.gpu_index)

    def _on_gpu_recovered(self, node: _Node, event: GpuRecovered) -> None:
        node.unhealthy.discard(event.gpu_index)

    # ---------------------------------------------------------------- jobs

    def _observe_job(self, event: JobEvent, position: int, at: float) -> None:
        if isinstance(event, JobSubmitted):
            if event.job_id not in self._jobs:
                spec = event.spec
                self._jobs[event.job_id] = _Job(spec, position, spec.queue or spec.team)
            return
        job = self._jobs.get(event.job_id)
        if job is None:
            self._flag(
                5, f"{event.type} for job {event.job_id}, which was never submitted", position
            )
            return
        if isinstance(event, TaskStarted | TaskExited):
            self._observe_rank(job, event, position)
        if job.terminal_at is not None:
            if isinstance(event, _NOT_AFTER_END):
                self._flag(
                    5,
                    f"{event.type} for job {event.job_id} after it finished",
                    job.terminal_at,
                    position,
                )
            return
        handler = _LIVE_JOB_FOLDS.get(type(event))
        if handler is not None:
            handler(self, job, event, position, at)

    def _on_admitted(self, job: _Job, event: JobAdmitted, position: int, at: float) -> None:
        job.queue = event.queue
        job.waiting, job.explained = True, False

    def _on_gang_reserved(self, job: _Job, event: GangReserved, position: int, at: float) -> None:
        self._observe_gang(job, event, position, at)

    def _release_gang(self, job: _Job, event: JobEvent) -> None:
        # An event without an attempt (suspended, cancelled outside one) releases any gang.
        attempt = getattr(event, "attempt", None)
        if attempt is None or attempt == job.attempt:
            self._release(event.job_id, job)

    def _on_requeued(self, job: _Job, event: JobRequeued, position: int, at: float) -> None:
        self._release_gang(job, event)
        job.waiting, job.explained = True, False

    def _on_suspended(self, job: _Job, event: JobSuspended, position: int, at: float) -> None:
        self._release_gang(job, event)
        job.waiting = False

    def _on_ended(self, job: _Job, event: JobEvent, position: int, at: float) -> None:
        self._release_gang(job, event)
        self._end(job, position)

    def _on_rejected(self, job: _Job, event: JobRejected, position: int, at: float) -> None:
        self._end(job, position)

    @staticmethod
    def _end(job: _Job, position: int) -> None:
        job.terminal_at = position
        job.waiting = False

    def _on_resumed(self, job: _Job, event: JobResumed, position: int, at: float) -> None:
        job.waiting, job.explained = True, False

    def _on_deferred(self, job: _Job, event: JobDeferred, position: int, at: float) -> None:
        job.explained = True
        self._check_reclaim(event.job_id, job, event, position, at)

    def _on_reservation_planned(
        self, job: _Job, event: ReservationPlanned, position: int, at: float
    ) -> None:
        job.explained = True

    def _observe_rank(self, job: _Job, event: TaskStarted | TaskExited, position: int) -> None:
        key = (event.job_id, event.attempt, event.rank)
        if isinstance(event, TaskExited):
            for slot in self._running_slots.pop(key, []):
                if self._running.get(slot, ("", 0, 0, 0))[:3] == key:
                    del self._running[slot]
            return
        if event.attempt != job.attempt or key in self._running_slots:
            return
        node = self._nodes.get(event.node_id)
        if node is None or node.lost:
            return
        slots = [(event.node_id, gpu) for gpu in job.rank_gpus.get(event.rank, ())]
        self._running_slots[key] = slots
        for slot in slots:
            self._running[slot] = (*key, position)

    def _release(self, job_id: str, job: _Job) -> None:
        for slot in job.gang:
            if self._bound.get(slot, ("", 0))[0] == job_id:
                del self._bound[slot]
        if job.gang:
            self._usage[job.queue] = self._usage.get(job.queue, 0) - len(job.gang)
        job.gang = []
        job.gang_at = None

    def _observe_gang(self, job: _Job, event: GangReserved, position: int, at: float) -> None:
        job_id = event.job_id
        if job.gang_at is not None:
            self._flag(
                2,
                f"job {job_id} got a second gang while its first is still bound",
                job.gang_at,
                position,
            )
            return
        spec = job.spec
        ranks = sorted(event.ranks, key=lambda r: r.rank)
        numbers = [r.rank for r in ranks]
        if numbers != list(range(len(ranks))):
            self._flag(
                2, f"gang of job {job_id} has ranks {numbers}, not 0..{len(ranks) - 1}", position
            )
        if not spec.gang_min_tasks <= len(ranks) <= spec.tasks:
            self._flag(
                2,
                f"gang of job {job_id} binds {len(ranks)} ranks; it needs between "
                f"{spec.gang_min_tasks} and {spec.tasks}",
                position,
            )
        group = ranks_per_unit(spec)
        if len(ranks) % group:
            self._flag(2, f"gang of job {job_id} splits a tp group of {group} ranks", position)
        for placement in ranks:
            if len(set(placement.gpus)) != spec.gpus_per_task:
                self._flag(
                    2,
                    f"rank {placement.rank} of job {job_id} holds "
                    f"{len(set(placement.gpus))} GPUs, not {spec.gpus_per_task}",
                    position,
                )
            if group > 1:
                first = (
                    ranks[placement.rank - placement.rank % group]
                    if placement.rank < len(ranks)
                    else placement
                )
                if first.node_id != placement.node_id:
                    self._flag(
                        2,
                        f"tp group of rank {placement.rank} of job {job_id} spans "
                        f"nodes {first.node_id} and {placement.node_id}",
                        position,
                    )
        slots: list[tuple[str, int]] = []
        for placement in ranks:
            node = self._nodes.get(placement.node_id)
            if node is None:
                self._flag(3, f"job {job_id} placed on unknown node {placement.node_id}", position)
                continue
            if node.lost or node.draining or node.drained:
                what = "lost" if node.lost else "drained" if node.drained else "draining"
                self._flag(3, f"job {job_id} placed on {what} node {placement.node_id}", position)
            for gpu in placement.gpus:
                slot = (placement.node_id, gpu)
                if gpu not in node.gpus:
                    self._flag(
                        3,
                        f"job {job_id} placed on GPU {gpu} that node "
                        f"{placement.node_id} does not have",
                        position,
                    )
                elif gpu in node.unhealthy:
                    self._flag(
                        3,
                        f"job {job_id} placed on unhealthy GPU {gpu} of node {placement.node_id}",
                        position,
                    )
                running = self._running.get(slot)
                if running is not None and running[:2] != (job_id, event.attempt):
                    self._flag(
                        1,
                        f"GPU {gpu} of node {placement.node_id} given to job {job_id} "
                        f"attempt {event.attempt} while rank {running[2]} of job {running[0]} "
                        f"attempt {running[1]} still runs on it",
                        running[3],
                        position,
                    )
                holder = self._bound.get(slot)
                if holder is not None and holder[0] != job_id:
                    self._flag(
                        1,
                        f"GPU {gpu} of node {placement.node_id} bound to job "
                        f"{job_id} while job {holder[0]} holds it",
                        holder[1],
                        position,
                    )
                elif slot in slots:
                    self._flag(
                        1,
                        f"GPU {gpu} of node {placement.node_id} bound twice in the "
                        f"gang of job {job_id}",
                        position,
                    )
                slots.append(slot)
        for slot in slots:
            self._bound.setdefault(slot, (job_id, position))
        job.gang = slots
        job.rank_gpus = {p.rank: tuple(p.gpus) for p in ranks}
        job.gang_at = position
        job.gang_since = at
        job.attempt = event.attempt
        job.waiting = False
        job.entitled_since = None
        self._usage[job.queue] = self._usage.get(job.queue, 0) + len(slots)

    # ---------------------------------------------------------------- 4

    def _check_guarantees(self, position: int) -> None:
        """Guarantees that add up to more than the cluster can never all be reached."""
        capacity = self._capacity
        roots = [
            q for q in self._queues.values() if q.parent is None or q.parent not in self._queues
        ]
        promised = sum(q.guaranteed for q in roots)
        over = capacity > 0 and promised > capacity
        if over and not self._oversubscribed:
            self._flag(
                4,
                f"top-level guarantees add up to {promised} GPUs, more than the "
                f"cluster's {capacity}",
                *sorted(q.at for q in roots),
                position,
            )
        self._oversubscribed = over

    def _check_reclaim(
        self, job_id: str, job: _Job, event: JobDeferred, position: int, at: float
    ) -> None:
        """A job within its queue's guarantee must not wait long while borrowers could yield."""
        queue = self._queues.get(job.queue)
        gpus = job.spec.gang_min_tasks * job.spec.gpus_per_task
        if queue is None or self._usage.get(job.queue, 0) + gpus > queue.guaranteed:
            job.entitled_since = None
            return
        if event.code == QUOTA_CEILING:
            self._flag(
                4,
                f"job {job_id} was held at its queue ceiling while its queue "
                f"{job.queue} is within its guarantee",
                position,
            )
            return
        if self._policy.is_fifo or not self._policy.preemption:
            return  # a policy without reclaim makes no such promise (the fifo baseline)
        reclaimable = self._reclaimable(job.queue, at)
        if reclaimable < gpus:
            job.entitled_since = None
            return
        if job.entitled_since is None:
            job.entitled_since = at
        elif at - job.entitled_since > self._reclaim_within_s:
            self._flag(
                4,
                f"job {job_id} waited {at - job.entitled_since:.0f} s within the "
                f"guarantee of queue {job.queue} while {reclaimable} borrowed GPUs "
                "could have been reclaimed",
                job.submitted_at,
                position,
            )
            job.entitled_since = at

    def _reclaimable(self, queue: str, at: float) -> int:
        """Preemptible GPUs held beyond their queues' guarantees, by other queues."""
        borrowed: dict[str, int] = {}
        for name, used in self._usage.items():
            record = self._queues.get(name)
            guarantee = record.guaranteed if record is not None else 0
            if name != queue and used > guarantee:
                borrowed[name] = used - guarantee
        total = 0
        for other in self._jobs.values():
            if other.gang_at is None or other.queue not in borrowed:
                continue
            spec = other.spec
            pclass = self._policy.priority_class(spec.priority)
            if not pclass.preemptible or spec.preemptible is False:
                continue
            if at - other.gang_since < spec.min_runtime_s:
                continue
            total += len(other.gang)
        return min(total, sum(borrowed.values()))

    # ---------------------------------------------------------------- 5

    def unexplained(self) -> list[str]:
        """Admitted jobs, neither terminal nor placed, with no reason recorded since they began
        waiting (invariant 5).

        The log alone cannot tell a job waiting for the next cycle from a forgotten one, so a
        caller asks at a quiet point (right after a cycle's decisions are recorded).
        """
        return [
            job_id
            for job_id, job in self._jobs.items()
            if job.waiting and not job.explained and job.terminal_at is None
        ]

    def check_explained(self, position: int) -> None:
        """Record an invariant-5 violation for each job `unexplained()` names, at `position`."""
        for job_id in self.unexplained():
            job = self._jobs[job_id]
            self._flag(
                5, f"job {job_id} waits without a recorded reason", job.submitted_at, position
            )


def _on_known_node(
    fold: Callable[[Auditor, _Node, Any], None],
) -> Callable[[Auditor, Any, int], None]:
    """`fold` applied to a registered node only: events of an unknown node change nothing."""

    def folded(auditor: Auditor, event: NodeEvent, position: int) -> None:
        node = auditor._nodes.get(event.node_id)
        if node is not None:
            fold(auditor, node, event)

    return folded


# The dispatch table of what is not a job's event: each class the auditor follows, and how.
_AUDIT_FOLDS: dict[type[Event], Callable[[Auditor, Any, int], None]] = {
    NodeRegistered: Auditor._on_node_registered,
    TeamCreated: Auditor._on_queue,
    QueueConfigured: Auditor._on_queue,
    NodeLost: _on_known_node(Auditor._on_node_lost),
    NodeRecovered: _on_known_node(Auditor._on_node_recovered),
    NodeDrainRequested: _on_known_node(Auditor._on_drain_requested),
    NodeDrained: _on_known_node(Auditor._on_drained),
    NodeUndrained: _on_known_node(Auditor._on_undrained),
    GpuUnhealthy: _on_known_node(Auditor._on_gpu_unhealthy),
    GpuRecovered: _on_known_node(Auditor._on_gpu_recovered),
}


# The dispatch table of a job's events while the job has not finished.
_LIVE_JOB_FOLDS: dict[type[Event], Callable[[Auditor, _Job, Any, int, float], None]] = {
    JobAdmitted: Auditor._on_admitted,
    GangReserved: Auditor._on_gang_reserved,
    JobRequeued: Auditor._on_requeued,
    JobSuspended: Auditor._on_suspended,
    JobSucceeded: Auditor._on_ended,
    JobFailed: Auditor._on_ended,
    JobCancelled: Auditor._on_ended,
    JobRejected: Auditor._on_rejected,
    JobResumed: Auditor._on_resumed,
    JobDeferred: Auditor._on_deferred,
    ReservationPlanned: Auditor._on_reservation_planned,
}
