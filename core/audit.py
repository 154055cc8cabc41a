"""The auditor: replays any event sequence and checks the invariants of DESIGN §4.

1. A GPU is bound to at most one gang at any time, in the log and on the hardware: a gang is
   given no GPU on which a rank of another attempt still runs (TaskStarted, no TaskExited,
   node not lost since).
2. A gang is bound whole or not at all.
3. Nothing is placed on a drained, lost or unhealthy node or GPU.
4. A team can always reach its guaranteed quota (by reclaiming borrowed capacity).
5. Every submitted job is terminal, or pending with a reason; none is lost.
6. A deposed scheduler's writes are rejected (leader epoch fencing).

It also checks the promises of the scheduling policy (DESIGN §3) that a log can show; those
violations carry invariant 0 and the name of the rule (`RULES`):

- topology: `require: node|rack|block` keeps the gang in one such domain; `gpu_type` is honoured;
- cross_queue: another team never preempts a gang within its queue's guarantee;
- idle_capacity: nobody is preempted while idle GPUs could host the preemptor; idle GPUs of the
  head's reserved nodes do not, for a reclaiming preemptor the backfill rule keeps off them (it
  would not end before the head's start: core/reservation.py `kept_off_reserved`), read from
  the reservation recorded in the same cycle;
- borrowers_first: a gang within its guarantee (or of the preemptor's own queue) is evicted only
  when the eligible borrowers' gangs could not make room (off those reserved nodes, likewise);
- drain: a node is reported drained only once no gang holds a GPU on it;
- backfill: a later, lower-ordered job never lands on a node reserved in the same cycle when it
  would still run at the reservation's start;
- host_ceiling: the gangs of a queue's subtree never hold more CPUs or memory than the queue's
  `max_cpus` / `max_memory_mb` (core/host_quota.py), where one is set.

It keeps its own small model of the log (it does not trust the scheduler's state) and reports
each violation with the log positions of the events involved.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from functools import partial

from core.audit_sharing import SharingAudit
from core.estimates import RuntimeEstimates
from core.live_sharing import GpuAmount, is_fractional, placement_gpus
from core.policy import SchedulingPolicy
from core.reservation import kept_off_reserved, spec_runtime_estimate
from core.shape import Shape, needs_nvlink, pool_of, ranks_per_unit, shape_of
from core.state import rank_host
from schemas.base import Event
from schemas.jobs import (
    GANG_RELEASING_EVENTS,
    JOB_ENDING_EVENTS,
    GangReserved,
    JobAdmitted,
    JobCancelled,
    JobDeferred,
    JobEvent,
    JobFailed,
    JobRequeued,
    JobResumed,
    JobSpec,
    JobSubmitted,
    JobSucceeded,
    JobSuspended,
    JobUpdated,
    PreemptionRequested,
    RankPlacement,
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
    NodeLost,
    NodeRecovered,
    NodeRegistered,
    NodeUndrained,
)
from schemas.reasons import QUOTA_CEILING, RESERVED_HEAD, USER_WAIT_CODES
from schemas.teams import QueueConfigured, TeamCreated

# Events only the active scheduler writes: these are fenced by the leader epoch.
SCHEDULER_DECISIONS: tuple[type[Event], ...] = (
    GangReserved,
    PreemptionRequested,
    JobRequeued,
    ReservationPlanned,
    JobDeferred,
)
_TERMINAL: tuple[type[Event], ...] = JOB_ENDING_EVENTS
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


# What one scheduling cycle writes (core/cycle.py). Any other event lies between two cycles;
# so does a JobDeferred: the cycle records those last (its explain phase).
_CYCLE_WRITES: tuple[type[Event], ...] = (
    *SCHEDULER_DECISIONS,
    JobSucceeded,
    JobFailed,
    JobCancelled,
    JobSuspended,
    JobResumed,
    NodeDrained,
)


# Two times the log keeps to the microsecond (a reservation's start and its cycle's clock) may
# each be half of one off the floats the core compared.
_LOGGED_TIME_SLACK_S = 2e-6

# The scheduling promises of DESIGN §3 the auditor checks (violations with invariant 0).
RULES: dict[str, str] = {
    "topology": "a required node, rack or block locality, the GPU type and NVLink for "
    "tensor-parallel groups are honoured",
    "cross_queue": "another team never preempts a gang within its queue's guarantee",
    "idle_capacity": "no preemption while idle GPUs could serve",
    "borrowers_first": "borrowed capacity is reclaimed before a guarantee's or one's own",
    "drain": "a node is reported drained only when no gang holds it",
    "backfill": "backfill never delays a planned reservation",
    "host_ceiling": "a queue's gangs hold no more CPUs or memory than its ceilings",
}


@dataclass(frozen=True, slots=True)
class Violation:
    invariant: int
    message: str
    positions: tuple[int, ...]
    # For invariant 0 (a scheduling promise of DESIGN §3): which rule of RULES.
    rule: str = ""

    @property
    def kind(self) -> str:
        """'invariant 3' or 'rule topology': what a report groups violations by."""
        return f"rule {self.rule}" if self.invariant == 0 else f"invariant {self.invariant}"

    def __str__(self) -> str:
        """One line for reports (the simulator's and `gangway audit`'s)."""
        where = ", ".join(str(p) for p in self.positions)
        return f"{self.kind}: {self.message} (log positions {where})"


@dataclass(slots=True)
class _Node:
    gpus: frozenset[int]
    rack: str = ""
    block: str = ""
    gpu_type: str = ""
    nvlink: bool = True
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
    # What the gang's slices and shares hold, exactly (1/7 a 1g slice of an H100).
    fraction: Fraction = Fraction(0)
    # The current attempt's GPUs per rank, to know where its TaskStarted ranks run.
    rank_gpus: dict[int, tuple[int, ...]] = field(default_factory=dict)
    gang_at: int | None = None
    gang_since: float = 0.0
    attempt: int = 0
    waiting: bool = False
    # Admitted: from then on it waits for GPUs (with a reason), not for admission.
    admitted: bool = False
    # Suspended by request: it waits for a resume, not for GPUs.
    suspended: bool = False
    # Its class was changed by an update (JobUpdated): admission's does not undo it.
    priority_changed: bool = False
    # Whether a reason (JobDeferred, ReservationPlanned) was recorded since it began waiting.
    explained: bool = False
    # Invariant 4's accounting of its current wait (`_check_reclaim`): the seconds it was
    # entitled to reclaim so far, and its latest deferral judged (None: none yet this wait).
    entitled_s: float = 0.0
    reclaim_mark: _ReclaimMark | None = None
    priority: str = ""
    # When every rank of the current attempt had started (the core's start of min runtime).
    started_at: float | None = None
    started_ranks: set[int] = field(default_factory=set)
    preempting: bool = False
    # The job its gang is being evicted for, while it is (`preempting`).
    preempted_for: str | None = None
    last_preempted_at: float | None = None
    # Since when the job waits (admission, requeue, resume) and whether it ever preempted.
    waiting_since: float = 0.0
    preemptor: bool = False
    # The head's latest recorded reservation: (start, nodes, position and time of the record,
    # the clock of the cycle that planned it or None where the record names none).
    reservation: tuple[float, frozenset[str], int, float, float | None] | None = None


@dataclass(frozen=True, slots=True)
class _ReclaimMark:
    """A waiting job's latest deferral judged for invariant 4 (`Auditor._check_reclaim`)."""

    queue: str
    gpus: int
    # The queue's clock of entitled time for `gpus` more GPUs then (`_entitled_clock`).
    clock: float
    # Whether borrowed GPUs it could reclaim were there (None: not searched, its queue being
    # at its guarantee then), how many, and under which ceiling (for the report).
    enough: bool | None
    reclaimable: int
    where: str


@dataclass(slots=True)
class _Queue:
    parent: str | None
    guaranteed: int
    at: int
    max_gpus: int | None = None
    # Host ceilings: thousandths of a CPU, MB of memory (None: no ceiling).
    max_cpus_milli: int | None = None
    max_memory_mb: int | None = None


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
        # Invariant 4's clocks of entitled time: per queue, for each GPU count a waiting job of
        # it asks, the seconds (since the first such job was judged) during which its usage
        # plus that count was within its guarantee, and the time they run to. They move at
        # every change of the queue's usage or guarantee, so a wait is judged by event time,
        # not only at the job's own deferrals (`_check_reclaim`).
        self._entitled: dict[str, dict[int, float]] = {}
        self._entitled_at: dict[str, float] = {}
        # `_reclaim_room`'s answers since the state last changed: a cycle defers many jobs of
        # one queue and shape at one instant, and a JobDeferred changes nothing it reads. Keyed
        # by (queue, shape, held at a ceiling), valid for the (position of the latest event
        # other than a JobDeferred, instant) they were given at.
        self._rooms: dict[tuple[str, Shape, bool], tuple[bool, int, str]] = {}
        self._rooms_valid: tuple[int, float] | None = None
        self._changed_at = -1
        # Per queue, the CPUs (thousandths) and memory (MB) its gangs hold now; per job, what
        # its gang holds (released with it).
        self._host_usage: dict[str, tuple[int, int]] = {}
        self._host_held: dict[str, tuple[int, int]] = {}
        self._epoch = 0
        self._epoch_at: int | None = None
        self._oversubscribed = False
        # GPUs of every registered node, kept as nodes register: summing them on each
        # registration made registering a 12,500-node cluster quadratic.
        self._capacity = 0
        # The preemption plan being recorded: (preemptor, time) and its victims so far. Gangs
        # under eviction leave their queues' usage, but a plan's victims are judged together.
        self._plan: tuple[str, float] | None = None
        self._plan_victims: list[str] = []
        # Per queue, the least usage seen at the current instant (a cycle orders its jobs by
        # guarantee before it binds any of them).
        self._instant: float | None = None
        self._least_usage: dict[str, int] = {}
        self._ranks: dict[str, int] = {}
        # Whether the cycle that recorded the head's reservation may still be writing: the
        # core re-plans the head every cycle but records it only when it moves, so the
        # recorded nodes are the reserved ones only in that cycle (several cycles may share
        # one instant).
        self._reservation_cycle = False
        # The preemptors of the cycle being written (since the last event that lies between
        # two cycles): a head among them lands on its victims' GPUs, and its reservation keeps
        # no one off its nodes (`_kept_off`).
        self._cycle_preemptors: set[str] = set()
        # The one job whose recorded reservation may stand (each ReservationPlanned clears every
        # other's): the rules that read reservations look at it, not at every job ever seen.
        self._head: str | None = None
        # The jobs whose `preempting` is set (gangs under eviction): usage net of leaving
        # gangs is asked at every preemption, and a walk over every job ever seen grew with
        # the log.
        self._preempting: set[str] = set()
        # The jobs holding a gang (`gang_at` set): the rules about borrowed gangs look at them
        # (sums and sets, whatever the order), not at every job ever seen.
        self._with_gang: set[str] = set()
        # Those of them whose gang holds slices or shares (`fraction` above 0): the only ones
        # `_held` adds, asked twice at each preemption (a walk over every gang, 4,575 times on
        # the Philly window, where no gang holds a fraction).
        self._with_fraction: set[str] = set()
        # Runtimes learned from the log, as the scheduler learns them (core/estimates.py): from
        # every event seen, and from those before the current instant. A cycle plans with what
        # was recorded before it: the jobs it ends itself (its JobSucceeded, recorded with its
        # placements) teach only the next cycle, which may share the instant (a flood's cycles
        # run at once), so a backfill is judged by whichever of the two lets it end in time.
        self._estimates = RuntimeEstimates()
        self._estimates_before = RuntimeEstimates()
        self._unlearned: list[tuple[Event, float]] = []
        # Invariant 1 for slices and shares (core/audit_sharing.py).
        self._sharing = SharingAudit()

    def _flag(self, invariant: int, message: str, *positions: int) -> None:
        self.violations.append(Violation(invariant, message, tuple(positions)))

    def _broken(self, rule: str, message: str, *positions: int) -> None:
        """A scheduling promise of DESIGN §3 (one of RULES) was broken."""
        self.violations.append(Violation(0, message, tuple(positions), rule))

    def observe(self, event: Event, position: int, at: float, epoch: int | None) -> None:
        if at != self._instant:
            self._instant = at
            self._least_usage = dict(self._usage)
            self._plan, self._plan_victims = None, []
            for earlier, when in self._unlearned:
                self._estimates_before.apply(earlier, when)
            self._unlearned.clear()
        self._check_fencing(event, position, epoch)
        if isinstance(event, JobDeferred) or not isinstance(event, _CYCLE_WRITES):
            self._reservation_cycle = False
            if self._cycle_preemptors:
                self._cycle_preemptors.clear()
        if not isinstance(event, JobDeferred):
            self._changed_at = position
        for message in self._sharing.observe(event, position, at):
            self._flag(1, message, position)
        self._estimates.apply(event, at)
        self._unlearned.append((event, at))
        if isinstance(event, JobEvent):
            self._observe_job(event, position, at)
        elif isinstance(event, NodeRegistered):
            previous = self._nodes.get(event.node_id)
            if previous is not None:
                self._capacity -= len(previous.gpus)
            self._nodes[event.node_id] = _Node(
                gpus=frozenset(g.index for g in event.gpus),
                rack=event.rack,
                block=event.block,
                gpu_type=event.gpu_type,
                nvlink=event.nvlink,
            )
            self._capacity += len(self._nodes[event.node_id].gpus)
            self._check_guarantees(position)
        elif isinstance(event, TeamCreated | QueueConfigured):
            name = event.name
            self._advance_entitled(name)  # its guarantee may change here
            self._queues[name] = _Queue(
                event.parent,
                event.guaranteed_gpus,
                position,
                event.max_gpus,
            )
            if isinstance(event, QueueConfigured):
                record = self._queues[name]
                record.max_cpus_milli = None if event.max_cpus is None else event.max_cpus * 1000
                record.max_memory_mb = event.max_memory_mb
            self._check_guarantees(position)
        else:
            self._observe_node(event, position)

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

    def _observe_node(self, event: Event, position: int) -> None:
        node_id = getattr(event, "node_id", None)
        node = self._nodes.get(node_id) if isinstance(node_id, str) else None
        if node is None:
            return
        if isinstance(event, NodeLost | GpuUnhealthy | NodeDrainRequested):
            # The core plans again when a reserved node loses capacity (several cycles may
            # share one instant, so the reservation's time alone cannot tell it is stale).
            head = self._jobs.get(self._head) if self._head is not None else None
            if head is not None and head.reservation is not None and node_id in head.reservation[1]:
                head.reservation = None
        if isinstance(event, NodeDrained):
            holders = sorted(
                {job for (node_key, _), (job, _) in self._bound.items() if node_key == node_id}
            )
            if holders:
                self._broken(
                    "drain",
                    f"node {node_id} reported drained while job {holders[0]} still holds "
                    "GPUs on it",
                    position,
                )
        if isinstance(event, NodeLost):
            node.lost = True
            for slot, (job_id, attempt, rank, _) in list(self._running.items()):
                if slot[0] == event.node_id:
                    del self._running[slot]
                    self._running_slots.pop((job_id, attempt, rank), None)
        elif isinstance(event, NodeRecovered):
            node.lost = False
        elif isinstance(event, NodeDrainRequested):
            node.draining = True
        elif isinstance(event, NodeDrained):
            node.drained, node.draining = True, False
        elif isinstance(event, NodeUndrained):
            node.drained = node.draining = False
        elif isinstance(event, GpuUnhealthy):
            node.unhealthy.add(event.gpu_index)
        elif isinstance(event, GpuRecovered):
            node.unhealthy.discard(event.gpu_index)

    # ---------------------------------------------------------------- jobs

    def _observe_job(self, event: JobEvent, position: int, at: float) -> None:
        if isinstance(event, JobSubmitted):
            if event.job_id not in self._jobs:
                spec = event.spec
                self._jobs[event.job_id] = _Job(
                    spec, position, spec.queue or spec.team, priority=spec.priority
                )
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
        if isinstance(event, JobAdmitted):
            job.queue = event.queue
            job.admitted = True
            if not job.priority_changed:
                job.priority = event.priority
            # Admitted late, after it was suspended: it waits once resumed.
            if not job.suspended:
                job.waiting, job.explained = True, False
                job.waiting_since = at
        elif isinstance(event, GangReserved):
            self._check_backfill(event.job_id, job, event, position, at)
            self._observe_gang(job, event, position, at)
        elif isinstance(event, GANG_RELEASING_EVENTS):
            attempt = getattr(event, "attempt", None)
            if attempt is None or attempt == job.attempt:
                self._release(event.job_id, job)
            if isinstance(event, JobRequeued):
                job.waiting, job.explained = True, False
                job.waiting_since = at
            job.reservation = None
        elif isinstance(event, JobUpdated):
            # The spec the scheduler judges from now on (the API refuses a change to a job
            # holding GPUs, and the core ignores a late one).
            if job.gang_at is None:
                job.spec = event.changes.applied_to(job.spec)
                if event.changes.priority is not None:
                    job.priority, job.priority_changed = job.spec.priority, True
        elif isinstance(event, JobResumed):
            job.suspended = False
            # Resumed before admission decided: it waits for admission, as when submitted.
            if job.admitted:
                job.waiting, job.explained = True, False
                job.waiting_since = at
        elif isinstance(event, JobDeferred):
            job.explained = True
            if event.code != RESERVED_HEAD:
                job.reservation = None
            self._check_reclaim(event.job_id, job, event, position, at)
        elif isinstance(event, ReservationPlanned):
            job.explained = True
            # One head at a time: a new head's reservation replaces any other job's.
            previous = self._jobs.get(self._head) if self._head is not None else None
            if previous is not None:
                previous.reservation = None
            self._head = event.job_id
            decided = None if event.decided_at is None else event.decided_at.timestamp()
            job.reservation = (
                event.start_at.timestamp(),
                frozenset(event.nodes),
                position,
                at,
                decided,
            )
            self._reservation_cycle = True
        elif isinstance(event, TaskStarted):
            if event.attempt == job.attempt and job.gang_at is not None:
                job.started_ranks.add(event.rank)
                ranks = self._ranks.get(event.job_id, 0)
                if (
                    job.started_at is None
                    and not job.preempting
                    and len(job.started_ranks) >= ranks
                ):
                    job.started_at = at
        elif isinstance(event, PreemptionRequested):
            self._observe_preemption(job, event, position, at)
        if isinstance(event, _TERMINAL):
            job.terminal_at = position
            job.waiting = False
        elif isinstance(event, JobSuspended):
            job.waiting, job.suspended = False, True

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
            self._advance_entitled(job.queue)
            self._usage[job.queue] = self._usage.get(job.queue, 0) - len(job.gang)
        held = self._host_held.pop(job_id, None)
        if held is not None:
            cpus, memory = self._host_usage.get(job.queue, (0, 0))
            self._host_usage[job.queue] = (cpus - held[0], memory - held[1])
        job.gang = []
        job.fraction = Fraction(0)
        job.gang_at = None
        self._with_gang.discard(job_id)
        self._with_fraction.discard(job_id)
        job.started_at = None
        job.started_ranks = set()
        job.preempting, job.preempted_for = False, None
        self._preempting.discard(job_id)
        self._note_usage(job.queue)

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
                if placement.mig is not None or placement.share is not None:
                    continue  # part of a GPU: SharingAudit judges how it is shared
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
        job.fraction = sum(
            (Fraction(placement_gpus(p)) for p in ranks if is_fractional(p)), Fraction(0)
        )
        job.rank_gpus = {
            p.rank: tuple(p.gpus) if p.mig is None and p.share is None else () for p in ranks
        }
        job.gang_at = position
        self._with_gang.add(job_id)
        if job.fraction:
            self._with_fraction.add(job_id)
        else:
            self._with_fraction.discard(job_id)
        job.gang_since = at
        job.attempt = event.attempt
        job.waiting = False
        job.entitled_s, job.reclaim_mark = 0.0, None
        job.started_at = None
        job.started_ranks = set()
        job.preempting, job.preempted_for = False, None
        self._preempting.discard(job_id)
        job.reservation = None
        self._ranks[job_id] = len(ranks)
        self._advance_entitled(job.queue)
        self._usage[job.queue] = self._usage.get(job.queue, 0) + len(slots)
        self._check_topology(job_id, spec, ranks, position)
        self._hold_host(job_id, job, len(ranks), position)

    # ---------------------------------------------------------------- §3: host ceilings

    def _hold_host(self, job_id: str, job: _Job, ranks: int, position: int) -> None:
        """Count the gang's CPUs and memory in its queue, and check every ceiling of the
        queue's chain against what the chain's subtrees hold now."""
        cpus_per_rank, memory_per_rank = rank_host(job.spec)
        if not (cpus_per_rank or memory_per_rank):
            return
        held = (cpus_per_rank * ranks, memory_per_rank * ranks)
        self._host_held[job_id] = held
        cpus, memory = self._host_usage.get(job.queue, (0, 0))
        self._host_usage[job.queue] = (cpus + held[0], memory + held[1])
        for name in self._chain(job.queue):
            record = self._queues.get(name)
            if record is None or (record.max_cpus_milli is None and record.max_memory_mb is None):
                continue
            subtree = [
                used for queue, used in self._host_usage.items() if name in self._chain(queue)
            ]
            for what, used, ceiling, unit in (
                ("CPUs", sum(u[0] for u in subtree), record.max_cpus_milli, 1000),
                ("memory", sum(u[1] for u in subtree), record.max_memory_mb, 1),
            ):
                if ceiling is not None and used > ceiling:
                    self._broken(
                        "host_ceiling",
                        f"the gang of job {job_id} brings queue {name}'s {what} to "
                        f"{used / unit:g}, past its ceiling of {ceiling / unit:g}",
                        record.at,
                        position,
                    )

    # ---------------------------------------------------------------- §3: topology

    def _check_topology(
        self, job_id: str, spec: JobSpec, ranks: list[RankPlacement], position: int
    ) -> None:
        ids = [r.node_id for r in ranks if r.node_id in self._nodes]
        nodes = [self._nodes[node_id] for node_id in ids]
        require = spec.topology.require
        domains = {
            "node": {r.node_id for r in ranks},
            "rack": {node.rack for node in nodes},
            "block": {node.block for node in nodes},
        }.get(require, set())
        if len(domains) > 1:
            self._broken(
                "topology",
                f"job {job_id} requires one {require} but its gang spans "
                f"{', '.join(sorted(domains))}",
                position,
            )
        if spec.gpu_type is not None:
            wrong = sorted({node.gpu_type for node in nodes} - {spec.gpu_type})
            if wrong:
                self._broken(
                    "topology",
                    f"job {job_id} asks for {spec.gpu_type} GPUs but got {', '.join(wrong)}",
                    position,
                )
        if needs_nvlink(spec):
            pcie = sorted(
                {node_id for node_id, node in zip(ids, nodes, strict=True) if not node.nvlink}
            )
            if pcie:
                self._broken(
                    "topology",
                    f"job {job_id}'s tensor-parallel groups of {spec.topology.tp_size} GPUs "
                    f"were placed on {', '.join(pcie)}, whose GPUs NVLink does not join",
                    position,
                )

    # ---------------------------------------------------------------- §3: quotas

    def _note_usage(self, queue: str) -> None:
        used = self._usage.get(queue, 0)
        if used < self._least_usage.get(queue, used + 1):
            self._least_usage[queue] = used

    def _chain(self, queue: str) -> list[str]:
        chain: list[str] = []
        current: str | None = queue
        while current is not None and current not in chain and len(chain) < 16:
            chain.append(current)
            record = self._queues.get(current)
            current = record.parent if record is not None else None
        return chain

    def _subtree(self, queue: str, usage: dict[str, int]) -> int:
        """GPUs the queue and its descendants hold (as the core's quota book counts)."""
        return sum(used for name, used in usage.items() if queue in self._chain(name))

    def _guarantee(self, queue: str) -> int:
        record = self._queues.get(queue)
        return record.guaranteed if record is not None else 0

    def _staying(self) -> dict[str, int]:
        """GPUs per queue net of the gangs already on their way out (under eviction, but not
        the victims of the plan being recorded: the core judges a plan's victims together),
        and of the preemptors on their way in: a waiting job whose victims are leaving counts
        the GPUs it asked for (its shape's least) to its queue, as the core's book charges
        them (core/preemption.py `request_evictions`), but not the preemptor of the plan
        being recorded, which the core judged before it charged it."""
        usage = dict(self._usage)
        recording = self._plan[0] if self._plan is not None else None
        arriving: set[str] = set()
        for job_id in self._preempting:
            job = self._jobs[job_id]
            if job.gang_at is None or job_id in self._plan_victims:
                continue
            usage[job.queue] = usage.get(job.queue, 0) - len(job.gang)
            preemptor_id = job.preempted_for
            if preemptor_id is None or preemptor_id == recording or preemptor_id in arriving:
                continue
            preemptor = self._jobs.get(preemptor_id)
            if preemptor is None or not preemptor.waiting or preemptor.gang_at is not None:
                continue
            arriving.add(preemptor_id)
            gpus = shape_of(preemptor.spec).min_gpus
            usage[preemptor.queue] = usage.get(preemptor.queue, 0) + gpus
        return usage

    def _excess(self, queue: str, gpus: int, usage: dict[str, int]) -> dict[str, int]:
        """The queues on the chain whose max `gpus` more would exceed, and by how much: idle
        GPUs do not serve a job its quota holds back (a parent's ceiling a sibling filled)."""
        over: dict[str, int] = {}
        for name in self._chain(queue):
            record = self._queues.get(name)
            if record is None or record.max_gpus is None:
                continue
            beyond = self._subtree(name, usage) + gpus - record.max_gpus
            if beyond > 0:
                over[name] = beyond
        return over

    def _excess_after(self, queue: str, gpus: int, evicted: set[str]) -> dict[str, int]:
        """`_excess` once the `evicted` gangs are gone: borrowers of other queues make no
        room under a ceiling of the preemptor's own chain that they are not under (a queue
        at its max evicting its own gangs, as preemption for fairness does)."""
        usage = self._staying()
        for job_id in evicted:
            other = self._jobs[job_id]
            usage[other.queue] = usage.get(other.queue, 0) - len(other.gang)
        return self._excess(queue, gpus, usage)

    def _borrowing(self, queue: str) -> bool:
        """Whether the queue holds more than its guarantee, net of gangs under eviction."""
        return self._held(queue, self._staying()) > self._guarantee(queue)

    def _held(self, queue: str, staying: dict[str, int]) -> GpuAmount:
        """What the queue and its descendants hold, net of gangs under eviction; its slices
        and shares count exactly, as the core's quota book counts them."""
        held: GpuAmount = self._subtree(queue, staying)
        # Only a job holding a gang has a fraction (set when bound, cleared when released):
        # the jobs whose gang holds one, not every job ever seen.
        for job_id in self._with_fraction:
            job = self._jobs[job_id]
            if queue not in self._chain(job.queue):
                continue
            if not job.preempting or job_id in self._plan_victims:
                held += job.fraction
        return held

    # ---------------------------------------------------------------- §3: preemption

    def _observe_preemption(
        self, victim: _Job, event: PreemptionRequested, position: int, at: float
    ) -> None:
        if event.attempt != victim.attempt or victim.gang_at is None:
            return
        preemptor = self._jobs.get(event.preemptor_job_id or "")
        if preemptor is not None and (self._plan != (event.preemptor_job_id, at)):
            self._plan, self._plan_victims = (event.preemptor_job_id or "", at), []
        # The §3 promises are Gangway's policy's; a caller's baseline order (the simulator's
        # oracles) preempts by its own rule.
        if preemptor is not None and not self._policy.is_fifo and self._policy.order_key is None:
            self._check_victim(preemptor, victim, event, position, at)
            self._plan_victims.append(event.job_id)
            preemptor.preemptor = True
            self._cycle_preemptors.add(event.preemptor_job_id or "")
        victim.preempting, victim.preempted_for = True, event.preemptor_job_id
        self._preempting.add(event.job_id)
        victim.last_preempted_at = at

    def _check_victim(
        self, preemptor: _Job, victim: _Job, event: PreemptionRequested, position: int, at: float
    ) -> None:
        who = f"job {event.preemptor_job_id} preempted job {event.job_id}"
        borrower = victim.queue != preemptor.queue and self._borrowing(victim.queue)
        if victim.queue != preemptor.queue and not borrower:
            self._broken(
                "cross_queue",
                f"{who}, of queue {victim.queue}, which is within its guarantee of "
                f"{self._guarantee(victim.queue)} GPUs",
                victim.gang_at or position,
                position,
            )
        if preemptor.spec.fractional:
            # A slice's or share's room is a MIG instance or part of a GPU, which this model
            # of whole GPUs cannot judge (SharingAudit checks how GPUs are shared): the idle
            # capacity and borrowers-first rules do not judge slice and share preemptors.
            return
        shape = shape_of(preemptor.spec)
        # The reserved nodes the backfill rule keeps it off: no room of its, idle or freed.
        avoid = self._kept_off(event.preemptor_job_id or "", preemptor, at)
        # The quota tests before `_fits`, which walks every GPU: a preemptor its ceiling holds
        # back (the usual case for preemption within a queue) needs no walk.
        if (
            not self._plan_victims
            and not self._excess(preemptor.queue, shape.min_gpus, self._staying())
            and self._fits(shape, set(), avoid)
        ):
            self._broken(
                "idle_capacity",
                f"{who} while idle GPUs could host job {event.preemptor_job_id}",
                position,
            )
        elif not borrower:
            borrowers = self._eligible_borrowers(preemptor, shape, at)
            if not self._excess_after(preemptor.queue, shape.min_gpus, borrowers) and self._fits(
                shape, borrowers, avoid
            ):
                self._broken(
                    "borrowers_first",
                    f"{who} of queue {victim.queue} (not borrowing) although evicting "
                    f"borrowers ({', '.join(sorted(borrowers)[:3])}) would have made room",
                    position,
                )

    def _kept_off(self, preemptor_id: str, preemptor: _Job, at: float) -> frozenset[str]:
        """The head's reserved nodes, where the backfill rule keeps the preemptor off them
        (core/reservation.py `kept_off_reserved`, the core's one definition) and it reclaims
        (within its queue's guarantee); none otherwise.

        Read from the reservation recorded in this very cycle: the core records its head's
        reservation only when it moves, so a record of an earlier cycle may name other nodes
        and another start; a cycle that evicts for a job kept off them records the one it
        planned with (core/reservation.py `record_reservation`). Judged at that cycle's clock
        (its `decided_at`). The log does not say whether the preemptor was ordered behind the
        head, nor which of the two runtime estimates the cycle had learned (see
        `_estimates_before`): any job but the head, kept off by either estimate, is taken as
        kept off (the lenient reading: no report rests on a guess)."""
        policy = self._policy
        if not self._reservation_cycle or policy.is_fifo or not policy.backfill:
            return frozenset()
        head_id = self._head
        head = self._jobs.get(head_id) if head_id is not None else None
        if head is None or head_id == preemptor_id or head.reservation is None:
            return frozenset()
        if not head.waiting or head.terminal_at is not None:
            return frozenset()
        if head_id in self._cycle_preemptors:
            # The head asked for evictions itself in this cycle: it lands on its victims' GPUs,
            # and the core keeps no one off its reserved nodes (core/preemption.py `KeptOff`).
            return frozenset()
        # Only a reclaim (within its queue's guarantee) is planned so; a preemption by class
        # alone counts the head's idle GPUs as serving it (core/preemption.py `KeptOff`).
        guarantee = self._guarantee(preemptor.queue)
        used = self._held(preemptor.queue, self._staying())
        if not (guarantee > 0 and used + shape_of(preemptor.spec).min_gpus <= guarantee):
            return frozenset()
        start, nodes, _, planned_when, decided = head.reservation
        if planned_when != at:
            return frozenset()
        clock = at if decided is None else decided
        spec = preemptor.spec
        for known in (self._estimates_before, self._estimates):
            estimate = partial(spec_runtime_estimate, spec=spec, policy=policy, estimates=known)
            if kept_off_reserved(clock, start - _LOGGED_TIME_SLACK_S, estimate, preemptor_id):
                return nodes
        return frozenset()

    def _eligible_borrowers(self, preemptor: _Job, shape: Shape, at: float) -> set[str]:
        """Gangs of other, borrowing queues the preemptor may surely evict (a subset of the
        core's borrowers: protected gangs, gangs bound at this instant and overdue-reservation cases
        are left out)."""
        policy = self._policy
        pclass = policy.priority_class(preemptor.priority)
        staying = self._staying()
        # Slices and shares count: a queue holding 1.25 GPUs of slices is that much nearer
        # its guarantee for the core, so it must be here too.
        used = self._held(preemptor.queue, staying)
        guarantee = self._guarantee(preemptor.queue)
        reclaiming = guarantee > 0 and used + shape.min_gpus <= guarantee
        chosen: set[str] = set()
        # `_borrowing(queue)` per queue: the usage it reads is the same for every gang here.
        borrowing: dict[str, bool] = {}
        for job_id in self._with_gang:
            other = self._jobs[job_id]
            if other is preemptor or other.gang_at is None or other.queue == preemptor.queue:
                continue
            # Whether its queue borrows first: every test here only reads, so their order
            # changes no answer, and with guarantees that leave nothing to borrow (the Philly
            # runs without borrowing) no queue borrows and the gang's other tests are spared.
            borrows = borrowing.get(other.queue)
            if borrows is None:
                borrows = borrowing[other.queue] = self._subtree(
                    other.queue, staying
                ) > self._guarantee(other.queue)
            if not borrows:
                continue
            if other.preempting and job_id not in self._plan_victims:
                continue
            if other.gang_since == at:
                # Bound at this instant, by this very cycle (its writes share one instant): a
                # cycle chooses victims among the gangs its state held when it began, never one
                # it has just placed (attack4's storm: 62 false reports, position 34472).
                continue
            if shape.gpu_type is not None and any(
                self._nodes[node].gpu_type != shape.gpu_type for node, _ in other.gang[:1]
            ):
                continue
            vclass = policy.priority_class(other.priority)
            if not vclass.preemptible or other.spec.preemptible is False:
                continue
            started = other.started_at if other.started_at is not None else other.gang_since
            if at < started + other.spec.min_runtime_s:
                continue
            if other.last_preempted_at is not None and (
                at < other.last_preempted_at + policy.hysteresis_s
            ):
                continue
            if not ((pclass.can_preempt and vclass.rank < pclass.rank) or reclaiming):
                continue
            chosen.add(job_id)
        return chosen

    def _fits(self, shape: Shape, evicted: set[str], avoid: frozenset[str] = frozenset()) -> bool:
        """Whether the gang would fit the free GPUs plus those of the `evicted` gangs; on the
        nodes in `avoid` (a head's reserved nodes the gang is kept off), those of the evicted
        gangs alone (it goes first once they are gone; the idle ones there do not serve it)."""
        if shape.asks_host or shape.cpu_only:
            # This model counts GPUs only: whether CPUs or memory were short it cannot tell,
            # so the rules that ask it (idle capacity, borrowers first) do not judge such gangs.
            return False
        held = {slot for slot, (job, _) in self._bound.items() if job not in evicted}
        # A GPU stays held while a rank of a released gang still runs on it (invariant 1 on
        # the hardware): the core places nothing there until that rank exits.
        held |= {slot for slot, (job, *_) in self._running.items() if job not in evicted}
        best = 0
        pools: dict[str, dict[str, list[tuple[str, str, int]]]] = {}
        for node_id, node in self._nodes.items():
            if node.lost or node.draining or node.drained:
                continue
            if shape.gpu_type is not None and node.gpu_type != shape.gpu_type:
                continue
            if shape.nvlink and not node.nvlink:
                continue  # a tp group never spans GPUs that talk over PCIe
            # A GPU in MIG mode or holding shares is no whole GPU (core/sharing.py): counting
            # a fixed-MIG node's GPUs as idle flagged every reclaim on such a cluster.
            at = self._instant if self._instant is not None else 0.0
            avoided = node_id in avoid
            free = sum(
                1
                for gpu in node.gpus
                if gpu not in node.unhealthy
                and (node_id, gpu) not in held
                and self._sharing.whole_usable(node_id, gpu, at)
                and not (avoided and self._bound.get((node_id, gpu), ("",))[0] not in evicted)
            )
            units = free // shape.unit_gpus
            if units:
                # The core's placement pools: a gang never mixes nodes with and without
                # NVLink, even of one GPU type (core/shape.py `pool_of`).
                key = pool_of(node.gpu_type, node.nvlink)
                pools.setdefault(key, {}).setdefault("", []).append((node.rack, node.block, units))
        for pool in pools.values():
            entries = pool[""]
            if shape.require == "node":
                best = max(best, max(units for _, _, units in entries))
            elif shape.require in ("rack", "block"):
                per: dict[str, int] = {}
                for rack, block, units in entries:
                    key = rack if shape.require == "rack" else block
                    per[key] = per.get(key, 0) + units
                best = max(best, max(per.values()))
            else:
                best = max(best, sum(units for _, _, units in entries))
        return best >= shape.min_units

    # ---------------------------------------------------------------- §3: backfill

    def _check_backfill(
        self, job_id: str, job: _Job, event: GangReserved, position: int, at: float
    ) -> None:
        """A job ordered after the head may not run on its reserved nodes past its start.

        Judged at the clock of the cycle that recorded the reservation (its `decided_at`): the
        core places every job of a cycle by the clock it took when the cycle began, and the
        cycle's events are recorded when they commit, later (0.02-0.37 s in a storm, where a
        job ending exactly at the head's start was reported by its commit time). A record
        that names no clock (written before it did) is judged at its recorded time, the
        latest the cycle can have decided: such a report may be one of those, and says so.
        """
        policy = self._policy
        if policy.is_fifo or not policy.backfill or job.preemptor or not self._reservation_cycle:
            return
        # Only the last job to record a reservation may still hold one.
        head_id = self._head
        head = self._jobs.get(head_id) if head_id is not None else None
        if head is None:
            return
        planned = head.reservation
        if planned is None or head is job or not head.waiting or head.terminal_at:
            return
        start, nodes, planned_at, planned_when, decided = planned
        used = {r.node_id for r in event.ranks}
        if planned_when != at or not used & nodes:
            return
        clock = at if decided is None else decided
        if clock - job.waiting_since >= policy.aging_max_wait_s:
            return  # an aged job goes before the head
        spec = job.spec
        # The estimate the scheduler planned with: learned from the same log when the policy
        # learns runtimes (core/estimates.py), else what the spec states.
        given = spec.estimated_runtime_s or spec.max_runtime_s or policy.default_runtime_estimate_s
        estimate = given
        if policy.learned_runtimes:
            learned = [
                known.remaining_s(job_id, spec)
                for known in (self._estimates_before, self._estimates)
            ]
            estimate = min(given if one is None else one for one in learned)
        if clock + estimate <= start + _LOGGED_TIME_SLACK_S:
            return
        guarantee = self._guarantee(job.queue)
        least = self._subtree(job.queue, self._least_usage)
        if guarantee > 0 and least + shape_of(spec).min_gpus <= guarantee:
            return  # it may have been ordered first, within its guarantee
        rank = policy.priority_class(job.priority).rank
        head_rank = policy.priority_class(head.priority).rank
        after = rank < head_rank or (
            rank == head_rank and job.queue == head.queue and job.submitted_at > head.submitted_at
        )
        if after:
            unknown = (
                ""
                if decided is not None
                else " (judged at the recorded time: the reservation names no cycle clock)"
            )
            self._broken(
                "backfill",
                f"job {job_id} was placed on node(s) {', '.join(sorted(used & nodes))} "
                f"reserved for job {head_id} and would still run when its reservation "
                f"starts{unknown}",
                planned_at,
                position,
            )

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

    def _advance_entitled(self, queue: str) -> None:
        """Run the queue's clocks of entitled time (`_entitled`) up to now, before its usage or
        guarantee changes: each GPU count's clock gains the time since they last moved when
        the queue's usage plus that count was within its guarantee all that time."""
        clocks = self._entitled.get(queue)
        now = self._instant
        if clocks is None or now is None:
            return
        elapsed = now - self._entitled_at[queue]
        if elapsed <= 0:
            return
        self._entitled_at[queue] = now
        record = self._queues.get(queue)
        room = (record.guaranteed if record is not None else 0) - self._usage.get(queue, 0)
        for gpus in clocks:
            if gpus <= room:
                clocks[gpus] += elapsed

    def _entitled_clock(self, queue: str, gpus: int) -> float:
        """The queue's clock of entitled time for `gpus` more GPUs, read now: the seconds,
        since it began, during which the queue's usage plus `gpus` was within its guarantee
        (core/quota.py `within_guarantee`). Only differences of two readings mean anything."""
        clocks = self._entitled.get(queue)
        if clocks is None:
            clocks = self._entitled[queue] = {}
            self._entitled_at[queue] = self._instant or 0.0
        self._advance_entitled(queue)
        return clocks.setdefault(gpus, 0.0)

    def _check_reclaim(
        self, job_id: str, job: _Job, event: JobDeferred, position: int, at: float
    ) -> None:
        """A job within its queue's guarantee must not wait long while borrowers could yield:
        borrowed gangs whose GPUs, with the idle ones, could host its gang (its shape, type and
        topology: GPUs scattered where it cannot land are no use to it) and, held at a parent's
        ceiling, enough of them borrowed under that ceiling to give it room there.

        Judged at the job's deferrals, over the time it was entitled to reclaim: between two
        of them, the time during which its queue's usage plus its gang was within the queue's
        guarantee, read exactly from the queue's clock (`_entitled_clock`, moved at every
        GangReserved and release of the queue's gangs), counted where the deferrals at its ends
        that searched found borrowed GPUs it could reclaim (what they are in between the log
        does not say; one with the queue at its guarantee searches only when the other end
        did not either). The core records a deferral when the reason changes, so the queue
        may have reached its guarantee, and the job not been entitled, for most of the span
        between two (the Philly week's 48 false reports on queue b436b2). The time adds up
        over the wait, until the job is placed or waits by its own team's choice."""
        if event.code in USER_WAIT_CODES:
            # Held or waiting on its own pipeline: not entitled now, nor since its last deferral.
            job.entitled_s, job.reclaim_mark = 0.0, None
            return
        if self._policy.is_fifo or not self._policy.preemption:
            return  # a policy without reclaim makes no such promise (the fifo baseline)
        if job.priority == self._policy.idle_only_priority:
            return  # it runs on idle capacity only: it reclaims nothing (DESIGN §3)
        queue = self._queues.get(job.queue)
        shape = shape_of(job.spec)
        gpus = shape.min_gpus
        if queue is None or gpus > queue.guaranteed:
            job.entitled_s, job.reclaim_mark = 0.0, None  # never within its guarantee
            return
        entitled = self._entitled_clock(job.queue, gpus)
        mark = job.reclaim_mark
        if mark is not None and (mark.queue, mark.gpus) != (job.queue, gpus):
            mark = None  # admitted to another queue or its ask changed: another clock
        gained = entitled - mark.clock if mark is not None else 0.0
        earlier = mark.enough if mark is not None else None
        # Whether borrowed GPUs it could reclaim are there is searched for (the search walks
        # every gang and GPU) where the queue is within its guarantee now, or where it was
        # only in between (neither end of the span searched): a deferral with the queue at its
        # guarantee leaves the span to the earlier judgement, and the next span to the next.
        within = self._usage.get(job.queue, 0) + gpus <= queue.guaranteed
        enough: bool | None = None
        # Not searched now, the report names what the earlier search found.
        reclaimable, where = (mark.reclaimable, mark.where) if mark is not None else (0, "")
        if within or (gained > 0 and earlier is None):
            enough, reclaimable, where = self._reclaim_room(job, shape, event, at)
        job.reclaim_mark = _ReclaimMark(job.queue, gpus, entitled, enough, reclaimable, where)
        judged = [found for found in (earlier, enough) if found is not None]
        if gained > 0 and judged and all(judged):
            job.entitled_s += gained
        if job.entitled_s > self._reclaim_within_s:
            self._flag(
                4,
                f"job {job_id} waited {job.entitled_s:.0f} s within the "
                f"guarantee of queue {job.queue}{where} while {reclaimable} borrowed GPUs "
                "could have been reclaimed",
                job.submitted_at,
                position,
            )
            job.entitled_s = 0.0

    def _reclaim_room(
        self, job: _Job, shape: Shape, event: JobDeferred, at: float
    ) -> tuple[bool, int, str]:
        """Whether borrowed GPUs the job could reclaim are there now (enough to host its gang,
        or, held at a ceiling, to give it room under it), how many, and which ceiling."""
        valid = (self._changed_at, at)
        if self._rooms_valid != valid:
            self._rooms.clear()
            self._rooms_valid = valid
        key = (job.queue, shape, event.code == QUOTA_CEILING)
        known = self._rooms.get(key)
        if known is None:
            known = self._rooms[key] = self._search_room(job, shape, event, at)
        return known

    def _search_room(
        self, job: _Job, shape: Shape, event: JobDeferred, at: float
    ) -> tuple[bool, int, str]:
        gpus = shape.min_gpus
        reclaimable, gangs = self._reclaimable(job.queue, at, shape.gpu_type)
        enough = reclaimable >= gpus and self._fits(shape, gangs)
        where = ""
        if event.code == QUOTA_CEILING:
            over = self._excess(job.queue, gpus, self._usage)
            room = {name: self._reclaimable(job.queue, at, under=name)[0] for name in over}
            enough = (
                bool(over)
                and all(room[name] >= beyond for name, beyond in over.items())
                and self._fits(shape, self._reclaimable(job.queue, at)[1])
            )
            reclaimable = min(room.values(), default=0)
            where = f" at the ceiling of queue {', '.join(over)}"
        return enough, reclaimable, where

    def _reclaimable(
        self, queue: str, at: float, gpu_type: str | None = None, under: str | None = None
    ) -> tuple[int, set[str]]:
        """Preemptible GPUs held beyond their queues' guarantees by other queues, and their
        gangs (of the GPU type the job asks for: borrowed GPUs of another type are no use to
        it; and under the queue `under`, when room under its ceiling is what the job lacks)."""
        borrowed: dict[str, int] = {}
        for name, used in self._usage.items():
            record = self._queues.get(name)
            guarantee = record.guaranteed if record is not None else 0
            if under is not None and under not in self._chain(name):
                continue
            if name != queue and used > guarantee:
                borrowed[name] = used - guarantee
        total = 0
        gangs: set[str] = set()
        for other_id in self._with_gang:
            other = self._jobs[other_id]
            if other.gang_at is None or other.queue not in borrowed:
                continue
            if gpu_type is not None and any(
                self._nodes[node].gpu_type != gpu_type for node, _ in other.gang[:1]
            ):
                continue
            spec = other.spec
            pclass = self._policy.priority_class(spec.priority)
            if not pclass.preemptible or spec.preemptible is False:
                continue
            if at - other.gang_since < spec.min_runtime_s:
                continue
            total += len(other.gang)
            gangs.add(other_id)
        return min(total, sum(borrowed.values())), gangs

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
