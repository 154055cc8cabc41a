"""The scheduler's memory, folded from recorded events: `state.apply(event, at)`.

Folding is deterministic and tolerant: an event about a job or node the state never saw, or about
an attempt that is no longer current, changes nothing. GPUs are bound only by GangReserved and
released only by the gang-releasing events, so a replay of any log gives the same bindings.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from functools import lru_cache
from types import MappingProxyType
from typing import Any, Literal

from core.checkpointing import CheckpointKnowledge
from core.estimates import RuntimeEstimates
from core.live_sharing import GpuAmount, LiveSharing, is_fractional, placement_gpus
from core.policy import SchedulingPolicy
from core.retry import attempt_size, repeated_oom, retry_delay_s
from core.shape import Shape, describe_need, needs_nvlink, pool_of, shape_of
from schemas.base import Event
from schemas.jobs import (
    HOLDING_STATES,
    TERMINAL_STATES,
    WAITING_STATES,
    GangReserved,
    JobAdmitted,
    JobCancelled,
    JobCancelRequested,
    JobDeferred,
    JobFailed,
    JobHeld,
    JobHoldReleased,
    JobRejected,
    JobRequeued,
    JobResumed,
    JobResumeRequested,
    JobSpec,
    JobState,
    JobSubmitted,
    JobSucceeded,
    JobSuspended,
    JobSuspendRequested,
    JobUpdated,
    PreemptionRequested,
    RankPlacement,
    ReservationPlanned,
    TaskExited,
    TaskStarted,
)
from schemas.nodes import (
    GpuGeometryChanged,
    GpuRecovered,
    GpuUnhealthy,
    NodeDrained,
    NodeDrainRequested,
    NodeLost,
    NodeRecovered,
    NodeRegistered,
    NodeUndrained,
)
from schemas.reasons import (
    AGENT_RESTARTED,
    FAILURE_REQUEUE_CODES,
    LOST_GANG_REQUEUE_CODES,
    NOT_CONSIDERED,
    RESERVED_HEAD,
)
from schemas.teams import QueueConfigured, TeamCreated

JobStateName = JobState
NodeStateName = Literal["ready", "draining", "drained", "lost"]

# The TaskExited reason an agent reports for a rank it stopped for an eviction (after its
# checkpoint), whatever the exit code.
PREEMPTED_EXIT_REASON = "preempted"


# The wording of a shape's need, shared by the jobs of that shape: a cycle after a burst of
# submissions words thousands of needs at once (~2 µs each), of a few shapes. A frozen shape's
# wording never changes, so nothing here can go stale; the bound only caps the memory.
_need_of = lru_cache(maxsize=4_096)(describe_need)


@lru_cache(maxsize=4_096)
def _one_shape(shape: Shape) -> Shape:
    """The first shape equal to `shape` seen (while it is remembered): jobs of one shape share
    one object. A cycle looks thousands of jobs' shapes up in its per-shape answers (fits,
    infeasible, host blocker); equal keys that are one object skip the field-by-field
    comparison. Shapes are frozen values: sharing one changes no answer."""
    return shape


def popcount(mask: int) -> int:
    return mask.bit_count()


def bits(mask: int) -> list[int]:
    """The GPU indices set in `mask`, lowest first."""
    if 0 <= mask < _BYTE:
        # A node of up to 8 GPUs (a binding names thousands of ranks in one cycle).
        return list(_BYTE_BITS[mask])
    out: list[int] = []
    index = 0
    while mask:
        if mask & 1:
            out.append(index)
        mask >>= 1
        index += 1
    return out


_BYTE = 256
_BYTE_BITS: tuple[tuple[int, ...], ...] = tuple(
    tuple(index for index in range(8) if mask >> index & 1) for mask in range(_BYTE)
)


@dataclass(frozen=True, slots=True)
class JobStatus:
    """What a person (or the API) may ask about a job."""

    job_id: str
    state: JobStateName
    team: str
    queue: str
    priority: str
    gpus: int
    reason_code: str | None
    reason: str | None
    estimated_start: float | None
    placement: dict[str, list[int]]
    attempt: int
    submitted_at: float | None
    started_at: float | None
    name: str = ""
    tasks: int = 0
    gpus_per_task: int = 0
    requeues: int = 0
    finished_at: float | None = None
    reserved_nodes: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class NodeView:
    node_id: str
    hostname: str
    gpu_type: str
    rack: str
    block: str
    state: NodeStateName
    gpus: int
    free_gpus: int
    allocated_gpus: int
    unhealthy_gpus: tuple[int, ...]
    gangs: tuple[str, ...]
    labels: dict[str, str]


@dataclass(slots=True)
class NodeRecord:
    index: int
    node_id: str
    hostname: str
    gpu_type: str
    rack: str
    block: str
    gpu_count: int
    all_mask: int
    labels: dict[str, str]
    # Whether NVLink joins the node's GPUs (`NodeRegistered.nvlink`), and the placement pool
    # that follows from it and the GPU type (core/shape.py `pool_of`).
    nvlink: bool = True
    pool: str = ""
    # Dense ids of (pool, block, rack) and (pool, block): the placement's aggregates.
    rack_id: int = 0
    block_id: int = 0
    unhealthy_mask: int = 0
    bound_mask: int = 0
    lost: bool = False
    draining: bool = False
    drained: bool = False
    # An operator's drain may let running gangs go on until then (unix seconds; None: at once).
    drain_deadline: float | None = None
    # Gangs bound here: job id → the GPUs it holds on this node.
    gangs: dict[str, int] = field(default_factory=dict)
    # Ranks of released gangs that started here and have not exited yet, (job, attempt, rank)
    # → their GPUs: those GPUs go to no new gang until the rank is gone (or the node is lost).
    lingering: dict[tuple[str, int, int], int] = field(default_factory=dict)
    lingering_mask: int = 0
    # Ranks of released gangs that had not started here when released, (job, attempt, rank) →
    # their GPUs: their agent may still start one (it learns of the release after the log
    # does), so a gang bound to those GPUs is appended only if that job's stream has not moved
    # since it was folded (services/scheduler `segments`). Gone when the rank starts (it
    # lingers then), exits, the node is lost, or another gang's rank starts on those GPUs.
    unstarted: dict[tuple[str, int, int], int] = field(default_factory=dict)
    # Host resources the node declared (None: it declared none, and they are not limited), in
    # thousandths of a CPU and MB, and what the bound ranks ask of them (core/host.py).
    cpus_milli: int | None = None
    memory_mb: int | None = None
    cpus_bound_milli: int = 0
    memory_bound_mb: int = 0
    # GPUs in MIG mode or holding soft shares: out of the whole-GPU pool (core/live_sharing.py).
    shared_mask: int = 0

    def __post_init__(self) -> None:
        if not self.pool:
            self.pool = pool_of(self.gpu_type, self.nvlink)

    @property
    def schedulable(self) -> bool:
        return not (self.lost or self.draining or self.drained)

    @property
    def free_mask(self) -> int:
        if not self.schedulable:
            return 0
        return (
            self.all_mask
            & ~self.unhealthy_mask
            & ~self.bound_mask
            & ~self.lingering_mask
            & ~self.shared_mask
        )

    @property
    def state(self) -> NodeStateName:
        if self.lost:
            return "lost"
        if self.drained:
            return "drained"
        if self.draining:
            return "draining"
        return "ready"


@dataclass(slots=True)
class CoreJob:
    """The core's record of one job (the API's read model is `JobReadModel`)."""

    job_id: str
    seq: int
    spec: JobSpec | None
    state: JobStateName
    shape: Shape | None
    submitted_at: float | None
    # Read of every waiting job in every cycle (ordering, gating, placing, explaining): kept
    # together at the front, so that a cycle's passes over ~10,000 jobs share their cache lines.
    reason_code: str | None = None
    reason: str | None = None
    # Whether a cycle considered it since it last began waiting (a reason of its own recorded):
    # a cycle considers a bounded number of jobs not yet considered (core/ordering.py
    # `within_depth`).
    considered: bool = False
    # After a failure, no new gang before this time (retry backoff; None: no wait).
    retry_at: float | None = None
    # Held, waiting on dependencies or bounded by its array: core/gating.py must look at it
    # (most jobs are none of these, and the cycle passes them over at the cost of this flag).
    gated: bool = False
    # A preemptor that waits for its victims is placed first once they are released.
    awaiting_victims: tuple[str, ...] = ()
    # Held by request (or submitted held): never placed until released.
    held: bool = False
    # It asks MIG slices or GPU shares (`JobSpec.fractional`): placed through the sharing
    # ledger (core/fractional.py).
    fractional: bool = False
    queue: str = ""
    # "needs 64 GPUs (8 tasks x 8) …": the start of every explanation of this job.
    _need: str = ""
    team: str = ""
    priority: str = ""
    admitted: bool = False
    estimated_start: float | None = None
    reserved_nodes: tuple[str, ...] = ()
    attempt: int = 0
    # The current attempt's gang: rank → (node index, GPU mask), empty when nothing is bound.
    ranks: list[tuple[int, int]] = field(default_factory=list)
    # Exact: whole GPUs as an int, slices and shares as a Fraction (core/live_sharing.py).
    bound_gpus: GpuAmount = 0
    started_ranks: set[int] = field(default_factory=set)
    exit_codes: dict[int, int] = field(default_factory=dict)
    # Ranks whose exit said they were evicted ("preempted"): under eviction, exits 0 from every
    # rank with none of these mean the gang finished its work before the checkpoint was needed.
    evicted_ranks: set[int] = field(default_factory=set)
    # What the ranks that failed said about their end, and whether retrying cannot help.
    exit_reasons: dict[int, str] = field(default_factory=dict)
    # Started ranks whose node was lost since: gone with it, whatever their gang's fate.
    lost_ranks: set[int] = field(default_factory=set)
    # Ranks whose agent restarted under them (their exit says AGENT_RESTARTED): gone, but not
    # by the job's doing, so their exit spends no retry (core/reactions.py, react_to_gang).
    agent_lost_ranks: set[int] = field(default_factory=set)
    # Gangs of the job's requeued for such ranks alone in a row, each lost within a hysteresis
    # window of its start (core/retry.py `FREE_AGENT_RESTARTS`).
    agent_requeues: int = 0
    # The last released gang of this attempt: where a rank reported started late still runs.
    released_ranks: list[tuple[int, int]] = field(default_factory=list)
    permanent_failure: bool = False
    # Why retrying cannot help, when the core judged it (an out-of-memory exit repeated at the
    # same size); None when the failing rank's own reason says it (a launch that cannot work).
    permanent_reason: str | None = None
    # The attempts that ran out of memory, by their size (core/retry.py: attempt_size).
    oom_attempts: dict[str, set[int]] = field(default_factory=dict)
    # When the job last began waiting for a gang (admission, requeue, resume): aging runs from here.
    queued_at: float | None = None
    reserved_at: float | None = None
    started_at: float | None = None
    finished_at: float | None = None
    failures: int = 0
    requeues: int = 0
    cancel_requested: bool = False
    suspend_requested: bool = False
    resume_requested: bool = False
    preempt_requested_at: float | None = None
    preempt_grace_s: float = 0.0
    preemptor_id: str | None = None
    # Attained service (core/attained.py): GPU-seconds its released gangs ran, all attempts
    # together (the running gang's share is added from `started_at` when asked).
    attained_gpu_s: float = 0.0
    # Hysteresis: when this job was last preempted, and when it last caused a preemption.
    last_preempted_at: float | None = None
    last_preempting_at: float | None = None
    # The array this job is an element of (core/gating.py bounds its elements' parallelism).
    array_id: str | None = None
    # Its priority class was changed by an update (JobUpdated): admission's does not undo it.
    priority_changed: bool = False

    @property
    def gpus(self) -> int:
        return self.spec.total_gpus if self.spec is not None else 0

    def still_runs(self, rank: int) -> bool:
        """Whether the rank may still run on its GPUs: started, neither exited nor lost with
        its node. Its GPUs go to no other gang until it is gone."""
        return (
            rank in self.started_ranks
            and rank not in self.exit_codes
            and rank not in self.lost_ranks
        )

    @property
    def held_since(self) -> float | None:
        """Since when the current gang holds its GPUs: its start, else its binding."""
        return self.started_at if self.started_at is not None else self.reserved_at

    @property
    def need(self) -> str:
        # Worded on first use: replay folds many more jobs than any cycle explains.
        if not self._need and self.shape is not None:
            self._need = _need_of(self.shape)
        return self._need


@dataclass(frozen=True, slots=True)
class HostCapacity:
    """What the schedulable fleet offers: healthy GPUs, declared CPUs (thousandths), memory."""

    gpus: int
    cpus_milli: int
    memory_mb: int


@dataclass(slots=True, eq=False)
class FreeCapacityWatch:
    """The nodes whose free GPUs changed since the watcher last looked (it empties the set);
    None when a node's place in the topology changed and an index must be rebuilt whole."""

    changed: set[int] | None = None


@dataclass(slots=True, eq=False)
class HoldingWatch:
    """The jobs that entered, changed state within or left the holding states since the
    watcher last looked, in fold order, each with whether it entered holding anew (a new
    gang: it goes to the end of `holding_jobs`). The watcher empties the list."""

    changes: list[tuple[str, bool]] = field(default_factory=list)


@dataclass(slots=True, eq=False)
class WaitingWatch:
    """The jobs that entered or left the waiting jobs, or whose fields that order them may
    have changed while waiting, since the watcher last looked (it empties them), in the order
    first noted: a burst's arrivals come in nearly in submission order, which the order book
    sorts them by in about one comparison each (a set's order cost ~2 ms of sorting for a
    burst of ~9,400)."""

    changed: dict[str, None] = field(default_factory=dict)


@dataclass(slots=True, eq=False)
class EndWatch:
    """The jobs that were submitted or reached a terminal state since the watcher last looked
    (it empties the set): all that a dependency's verdict rests on (core/dependencies.py)."""

    changed: set[str] = field(default_factory=set)


# Events that change nothing of a waiting job but its reason, estimated start and reserved
# nodes: no watcher of the waiting jobs hears of them (a burst's first reasons are ~10,000).
_ORDER_BLIND: frozenset[type[Event]] = frozenset((JobDeferred, ReservationPlanned))


@dataclass(slots=True)
class QueueRecord:
    name: str
    parent: str | None = None
    guaranteed_gpus: int = 0
    max_gpus: int | None = None
    weight: float = 1.0
    configured: bool = False
    # GPUs bound now to gangs of this queue (not its children); exact for slices and shares.
    allocated: GpuAmount = 0
    # Exponentially decayed GPU usage (GPU·s, decayed), brought up to date at `usage_at`.
    decayed_usage: float = 0.0
    usage_at: float = 0.0
    # The same for host resources (thousandths of a CPU, MB): fair share is dominant-resource.
    allocated_cpus_milli: int = 0
    allocated_memory_mb: int = 0
    decayed_cpu_usage: float = 0.0
    decayed_memory_usage: float = 0.0
    # Ceilings on the subtree's CPUs (thousandths) and memory (MB) held at once; None: none.
    max_cpus_milli: int | None = None
    max_memory_mb: int | None = None


# What `holding_of` answers for a queue that holds nothing (read-only: callers only read).
_NO_JOBS: Mapping[str, CoreJob] = MappingProxyType({})


class SchedulerState:
    """Everything the core knows, folded from events. Read it through views; change it by apply."""

    def __init__(self, policy: SchedulingPolicy | None = None) -> None:
        self.policy = policy if policy is not None else SchedulingPolicy()
        self._nodes: dict[str, NodeRecord] = {}
        self._node_list: list[NodeRecord] = []
        self._jobs: dict[str, CoreJob] = {}
        # Jobs admitted and waiting for a gang, in arrival order (dicts keep insertion order).
        self._waiting: dict[str, CoreJob] = {}
        # Jobs holding a gang (reserved, running, preempting).
        self._holding: dict[str, CoreJob] = {}
        # The same gangs by queue, each in `holding_jobs` order: preemption for fairness looks
        # at one queue's gangs.
        self._holding_by_queue: dict[str, dict[str, CoreJob]] = {}
        # The gangs being preempted (state `preempting`): each cycle credits their GPUs back to
        # their queues (core/preemption.py `credit_leaving`) without a walk over every gang.
        self._preempting: dict[str, CoreJob] = {}
        # Jobs with something for the reactions phase to decide (exits, requests, lost GPUs).
        self._attention: set[str] = set()
        self._queues: dict[str, QueueRecord] = {}
        # Nodes with placeable free GPUs: node index → free mask.
        self._free: dict[int, int] = {}
        # Who keeps an index of `_free` between cycles (a planner) and must hear what changed.
        self._free_watches: list[FreeCapacityWatch] = []
        # Who keeps timers of the holding gangs between cycles (a planner's reactions phase).
        self._holding_watches: list[HoldingWatch] = []
        # Who keeps the waiting jobs ordered between cycles (a planner's ordering phase).
        self._waiting_watches: list[WaitingWatch] = []
        # Who keeps dependency verdicts between cycles (a planner's gating phase).
        self._end_watches: list[EndWatch] = []
        self._draining: set[int] = set()
        # Indices of nodes where ranks of released gangs still run (`NodeRecord.lingering`):
        # the head's reservation plans their end without a walk over every node.
        self._lingering: set[int] = set()
        self._rack_ids: dict[tuple[str, str, str], int] = {}
        self._block_ids: dict[tuple[str, str], int] = {}
        self._seq = 0
        self._clock = 0.0
        self._allocated: GpuAmount = 0
        # MIG geometries, slices and soft shares (core/live_sharing.py).
        self._sharing = LiveSharing()
        self._total = 0
        self._unhealthy = 0
        self._lost_gpus = 0
        self._pending = 0
        # The latest moment a retry backoff ever ran to: once past it, no waiting job is in one.
        self._latest_retry_at = -math.inf
        # When a rank of any gang last started: whether the agents hear reservations at all.
        self._last_rank_started_at = -math.inf
        # Bumped by every fold that could change a decision (a planner memoises quiet cycles).
        self._version = 0
        self._node_generation = 0
        self._profile: tuple[int, dict[str, int], dict[str, int]] | None = None
        # Whether a node whose GPUs NVLink does not join ever registered (`Shape.nvlink`).
        self._pcie_nodes = False
        self._host_profile: tuple[int, HostCapacity] | None = None
        # Runtimes learned from finished jobs: a fold beside this one, over the same events.
        self._estimates = RuntimeEstimates()
        # Checkpoint costs and failure rates, for `checkpoint: {interval_s: auto}`.
        self._checkpoints = CheckpointKnowledge()
        self._handlers: dict[type[Event], Callable[[Any, float], None]] = {
            JobSubmitted: self._on_submitted,
            JobAdmitted: self._on_admitted,
            JobRejected: self._on_rejected,
            JobCancelRequested: self._on_cancel_requested,
            JobSuspendRequested: self._on_suspend_requested,
            JobResumeRequested: self._on_resume_requested,
            JobDeferred: self._on_deferred,
            ReservationPlanned: self._on_reservation_planned,
            GangReserved: self._on_gang_reserved,
            TaskStarted: self._on_task_started,
            TaskExited: self._on_task_exited,
            PreemptionRequested: self._on_preemption_requested,
            JobRequeued: self._on_requeued,
            JobSuspended: self._on_suspended,
            JobResumed: self._on_resumed,
            JobSucceeded: self._on_succeeded,
            JobFailed: self._on_failed,
            JobCancelled: self._on_cancelled,
            JobHeld: self._on_held,
            JobHoldReleased: self._on_hold_released,
            JobUpdated: self._on_updated,
            NodeRegistered: self._on_node_registered,
            NodeLost: self._on_node_lost,
            NodeRecovered: self._on_node_recovered,
            NodeDrainRequested: self._on_drain_requested,
            NodeDrained: self._on_drained,
            NodeUndrained: self._on_undrained,
            GpuUnhealthy: self._on_gpu_unhealthy,
            GpuRecovered: self._on_gpu_recovered,
            GpuGeometryChanged: self._on_geometry_changed,
            TeamCreated: self._on_team_created,
            QueueConfigured: self._on_queue_configured,
        }

    # ---------------------------------------------------------------- evolve

    def apply(self, event: Event, at: float) -> None:
        """Fold one recorded event, recorded at `at` (unix seconds)."""
        handler = self._handlers.get(type(event))
        if at > self._clock:
            self._clock = at
        self._estimates.apply(event, at)
        self._checkpoints.apply(event, at)
        if handler is None:
            return
        handler(event, at)
        self._version += 1
        if self._waiting_watches and type(event) not in _ORDER_BLIND:
            # Whatever an event does to a waiting job, it is that job's event (but for the
            # victims a preemptor awaits: `_on_preemption_requested`).
            job_id = getattr(event, "job_id", None)
            if job_id is not None and job_id in self._waiting:
                self._touch_waiting(job_id)

    def apply_all(self, events: Iterable[tuple[Event, float]]) -> None:
        for event, at in events:
            self.apply(event, at)

    # ---------------------------------------------------------------- views

    def job(self, job_id: str) -> JobStatus | None:
        record = self._jobs.get(job_id)
        return None if record is None else self._job_view(record)

    def jobs(self) -> Iterator[JobStatus]:
        return (self._job_view(record) for record in self._jobs.values())

    def node(self, node_id: str) -> NodeView | None:
        record = self._nodes.get(node_id)
        return None if record is None else _node_view(record)

    def nodes(self) -> Iterator[NodeView]:
        return (_node_view(record) for record in self._node_list)

    @property
    def allocated_gpus(self) -> GpuAmount:
        """GPUs bound to gangs, exactly (a 1g slice of an H100 counts 1/7)."""
        return self._allocated

    @property
    def sharing(self) -> LiveSharing:
        """MIG geometries, slices and soft shares (read-only for the cycle, as the rest)."""
        return self._sharing

    @property
    def total_gpus(self) -> int:
        """GPUs of every registered node that is not lost."""
        return self._total - self._lost_gpus

    @property
    def healthy_gpus(self) -> int:
        """GPUs that could take work: on nodes neither lost, draining nor drained, and healthy."""
        return sum(
            popcount(node.all_mask & ~node.unhealthy_mask)
            for node in self._node_list
            if node.schedulable
        )

    @property
    def free_gpus(self) -> int:
        return sum(popcount(mask) for mask in self._free.values())

    @property
    def pending(self) -> int:
        """Jobs submitted and not yet holding a gang or finished (pending and queued)."""
        return self._pending

    @property
    def clock(self) -> float:
        """The latest recorded time folded so far."""
        return self._clock

    def capacity_profile(self) -> tuple[dict[str, int], dict[str, int]]:
        """Per placement pool (core/shape.py `pool_of`: the GPU type, nodes without NVLink set
        apart): the largest schedulable node's healthy GPUs, and all schedulable GPUs.

        What an empty cluster could offer; it tells a gang that can never fit from one that waits.
        Cached until a node event changes it.
        """
        cached = self._profile
        if cached is not None and cached[0] == self._node_generation:
            return cached[1], cached[2]
        biggest: dict[str, int] = {}
        capacity: dict[str, int] = {}
        for node in self._node_list:
            if not node.schedulable:
                continue
            healthy = popcount(node.all_mask & ~node.unhealthy_mask)
            pool = node.pool
            biggest[pool] = max(biggest.get(pool, 0), healthy)
            capacity[pool] = capacity.get(pool, 0) + healthy
        self._profile = (self._node_generation, biggest, capacity)
        return biggest, capacity

    def host_capacity(self) -> HostCapacity:
        """The schedulable fleet's healthy GPUs, declared CPUs (thousandths) and memory (MB):
        the denominators of dominant-resource fair share. Cached until a node event changes it."""
        cached = self._host_profile
        if cached is not None and cached[0] == self._node_generation:
            return cached[1]
        gpus = cpus = memory = 0
        for node in self._node_list:
            if not node.schedulable:
                continue
            gpus += popcount(node.all_mask & ~node.unhealthy_mask)
            cpus += node.cpus_milli or 0
            memory += node.memory_mb or 0
        capacity = HostCapacity(gpus, cpus, memory)
        self._host_profile = (self._node_generation, capacity)
        return capacity

    def queue_usage(self, queue: str) -> GpuAmount:
        record = self._queues.get(queue)
        return 0 if record is None else record.allocated

    # ---------------------------------------------------------------- planning surface
    # What the cycle and its planners read. Read-only by contract: only `apply` changes the
    # state; the records handed out are the state's own, for speed, and must not be written.

    @property
    def estimates(self) -> RuntimeEstimates:
        return self._estimates

    @property
    def checkpoints(self) -> CheckpointKnowledge:
        return self._checkpoints

    @property
    def version(self) -> int:
        """Bumped by every fold that could change a decision."""
        return self._version

    @property
    def node_records(self) -> Sequence[NodeRecord]:
        """Every node ever registered, by its dense index."""
        return self._node_list

    def node_record(self, node_id: str) -> NodeRecord | None:
        return self._nodes.get(node_id)

    @property
    def job_records(self) -> Mapping[str, CoreJob]:
        return self._jobs

    @property
    def waiting_jobs(self) -> Mapping[str, CoreJob]:
        """Jobs admitted and waiting for a gang, in arrival order."""
        return self._waiting

    @property
    def latest_retry_at(self) -> float:
        """No waiting job is in its retry backoff at or after this moment (-inf: none ever was)."""
        return self._latest_retry_at

    @property
    def last_rank_started_at(self) -> float:
        """When the latest TaskStarted of any job was recorded (-inf: none ever was): an agent
        heard a reservation then (core/reactions.py `launch_overdue`)."""
        return self._last_rank_started_at

    @property
    def holding_jobs(self) -> Mapping[str, CoreJob]:
        """Jobs holding a gang (reserved, running, preempting)."""
        return self._holding

    @property
    def attention(self) -> AbstractSet[str]:
        """Jobs with something for the reactions phase to decide (exits, requests, hardware)."""
        return self._attention

    @property
    def draining_nodes(self) -> AbstractSet[int]:
        """Indices of nodes draining or recently released by a gang while draining."""
        return self._draining

    def holding_of(self, queue: str) -> Mapping[str, CoreJob]:
        """The queue's gangs of `holding_jobs`, in its order (a job's queue is set at admission,
        before it can hold a gang)."""
        return self._holding_by_queue.get(queue, _NO_JOBS)

    @property
    def preempting_jobs(self) -> Mapping[str, CoreJob]:
        """The gangs of `holding_jobs` being preempted (state `preempting`)."""
        return self._preempting

    @property
    def lingering_nodes(self) -> AbstractSet[int]:
        """Indices of nodes where ranks of released gangs have not exited yet."""
        return self._lingering

    def lingering_jobs(self) -> set[str]:
        """The jobs whose released gangs still have a rank running (`NodeRecord.lingering`):
        their GPUs count as held, so a decision that counted them (a preemption) is stale
        once one of those ranks exits."""
        return {
            job_id for index in self._lingering for job_id, _, _ in self._node_list[index].lingering
        }

    def unstarted_jobs(self, node_id: str, gpus: Iterable[int]) -> set[str]:
        """The jobs whose released gangs had a rank not yet started on any of these GPUs of
        the node (`NodeRecord.unstarted`): a late start of one would be a rank on a GPU that
        a new gang takes."""
        node = self._nodes.get(node_id)
        if node is None or not node.unstarted:
            return set()
        mask = 0
        for gpu in gpus:
            mask |= 1 << gpu
        return {job_id for (job_id, _, _), held in node.unstarted.items() if held & mask}

    @property
    def queue_records(self) -> Mapping[str, QueueRecord]:
        return self._queues

    @property
    def free_masks(self) -> Mapping[int, int]:
        """Nodes with placeable free GPUs: node index → free mask."""
        return self._free

    def watch_free_capacity(self) -> FreeCapacityWatch:
        """Be told which nodes' free GPUs change from now on (for an index kept between cycles)."""
        watch = FreeCapacityWatch()
        self._free_watches.append(watch)
        return watch

    def unwatch_free_capacity(self, watch: FreeCapacityWatch) -> None:
        if watch in self._free_watches:
            self._free_watches.remove(watch)

    def watch_holding(self) -> HoldingWatch:
        """Be told which jobs enter, change within or leave the holding states from now on."""
        watch = HoldingWatch()
        self._holding_watches.append(watch)
        return watch

    def unwatch_holding(self, watch: HoldingWatch) -> None:
        if watch in self._holding_watches:
            self._holding_watches.remove(watch)

    def watch_waiting(self) -> WaitingWatch:
        """Be told which jobs enter, leave or change within the waiting jobs from now on."""
        watch = WaitingWatch()
        self._waiting_watches.append(watch)
        return watch

    def unwatch_waiting(self, watch: WaitingWatch) -> None:
        if watch in self._waiting_watches:
            self._waiting_watches.remove(watch)

    def watch_ends(self) -> EndWatch:
        """Be told which jobs are submitted or end from now on."""
        watch = EndWatch()
        self._end_watches.append(watch)
        return watch

    def unwatch_ends(self, watch: EndWatch) -> None:
        if watch in self._end_watches:
            self._end_watches.remove(watch)

    def _touch_ends(self, job_id: str) -> None:
        for watch in self._end_watches:
            watch.changed.add(job_id)

    def _touch_waiting(self, job_id: str) -> None:
        for watch in self._waiting_watches:
            watch.changed[job_id] = None

    def __getstate__(self) -> dict[str, Any]:
        # Watchers belong to the live process's planners; a thawed state starts with none.
        return {
            **self.__dict__,
            "_free_watches": [],
            "_holding_watches": [],
            "_waiting_watches": [],
            "_end_watches": [],
        }

    def _job_view(self, job: CoreJob) -> JobStatus:
        placement: dict[str, list[int]] = {}
        for node_index, mask in job.ranks:
            node_id = self._node_list[node_index].node_id
            placement.setdefault(node_id, []).extend(bits(mask))
        for spot in self._sharing.spots_of(job.job_id):
            placement.setdefault(spot.node_id, []).extend(spot.gpus)
        for gpus in placement.values():
            gpus.sort()
        spec = job.spec
        return JobStatus(
            job_id=job.job_id,
            state=job.state,
            team=job.team,
            queue=job.queue,
            priority=job.priority,
            # Whole GPUs here (a slice or share job: its tasks); exact amounts: bound_gpus.
            gpus=job.bound_gpus if job.ranks and isinstance(job.bound_gpus, int) else job.gpus,
            reason_code=job.reason_code,
            reason=job.reason,
            estimated_start=job.estimated_start,
            placement=placement,
            attempt=job.attempt,
            submitted_at=job.submitted_at,
            started_at=job.started_at,
            name=spec.name if spec is not None else "",
            tasks=len(job.ranks) if job.ranks else (spec.tasks if spec is not None else 0),
            gpus_per_task=spec.gpus_per_task if spec is not None else 0,
            requeues=job.requeues,
            finished_at=job.finished_at,
            reserved_nodes=job.reserved_nodes,
        )

    # ---------------------------------------------------------------- jobs

    def _set_state(self, job: CoreJob, new: JobStateName) -> None:
        old = job.state
        if old == new:
            return
        if old in WAITING_STATES:
            self._pending -= 1
        if new in WAITING_STATES:
            self._pending += 1
        if old == "queued":
            self._waiting.pop(job.job_id, None)
        if new == "queued":
            self._waiting[job.job_id] = job
        if self._waiting_watches and (old == "queued" or new == "queued"):
            self._touch_waiting(job.job_id)
        if old in HOLDING_STATES and new not in HOLDING_STATES:
            self._holding.pop(job.job_id, None)
            self._holding_by_queue.get(job.queue, {}).pop(job.job_id, None)
        if new in HOLDING_STATES:
            self._holding[job.job_id] = job
            self._holding_by_queue.setdefault(job.queue, {})[job.job_id] = job
        if old == "preempting":
            self._preempting.pop(job.job_id, None)
        if new == "preempting":
            self._preempting[job.job_id] = job
        job.state = new
        if self._end_watches and new in TERMINAL_STATES:
            self._touch_ends(job.job_id)
        if self._holding_watches and (old in HOLDING_STATES or new in HOLDING_STATES):
            entered = old not in HOLDING_STATES
            for watch in self._holding_watches:
                watch.changes.append((job.job_id, entered))

    def _on_submitted(self, event: JobSubmitted, at: float) -> None:
        if event.job_id in self._jobs:
            return  # a duplicate delivery: the first submission stands
        spec = event.spec
        self._seq += 1
        job = CoreJob(
            job_id=event.job_id,
            seq=self._seq,
            spec=spec,
            state="pending",
            shape=_one_shape(shape_of(spec, pcie_nodes=self._pcie_nodes)),
            submitted_at=at,
            team=spec.team,
            queue=spec.queue or spec.team,
            priority=spec.priority,
            reason_code="awaiting_admission",
            reason="waiting for admission",
            held=spec.hold,
            fractional=spec.fractional,
            array_id=event.array_id,
        )
        job.gated = _gated(job)
        self._jobs[event.job_id] = job
        self._pending += 1
        if self._end_watches:
            self._touch_ends(event.job_id)

    def _on_admitted(self, event: JobAdmitted, at: float) -> None:
        job = self._jobs.get(event.job_id)
        if job is None or not _awaits_admission(job):
            return
        job.queue = event.queue
        # A class changed by an update before admission decided stands (admission read the
        # submitted spec).
        if not job.priority_changed:
            job.priority = event.priority
        job.admitted = True
        if job.state == "suspended":
            return  # suspended before admission decided: queued once resumed
        job.queued_at = at
        job.considered = False
        job.reason_code = "queued"
        job.reason = "queued; waiting for the next scheduling cycle"
        self._set_state(job, "queued")

    def _on_rejected(self, event: JobRejected, at: float) -> None:
        job = self._jobs.get(event.job_id)
        if job is None or not _awaits_admission(job):
            return
        job.reason_code = event.code
        job.reason = event.reason
        job.finished_at = at
        self._set_state(job, "rejected")

    def _on_cancel_requested(self, event: JobCancelRequested, at: float) -> None:
        job = self._jobs.get(event.job_id)
        if job is None or job.state in TERMINAL_STATES:
            return
        job.cancel_requested = True
        self._attention.add(job.job_id)

    def _on_held(self, event: JobHeld, at: float) -> None:
        job = self._jobs.get(event.job_id)
        if job is None or job.state in TERMINAL_STATES:
            return
        job.held = True
        job.gated = True
        self._forget_reason(job)

    def _on_hold_released(self, event: JobHoldReleased, at: float) -> None:
        job = self._jobs.get(event.job_id)
        if job is None or job.state in TERMINAL_STATES or not job.held:
            return
        job.held = False
        job.gated = _gated(job)
        self._forget_reason(job)
        if job.state == "queued":
            # A held job keeps its arrival order, but its aging clock restarts: time spent
            # held is not time spent waiting for GPUs, and must not jump it ahead of others.
            job.queued_at = at

    @staticmethod
    def _forget_reason(job: CoreJob) -> None:
        """A hold and its release change a waiting job's reason behind the core's back (the
        read models show `held`, then nothing): the next cycle records its reason anew."""
        if job.state in ("pending", "queued"):
            job.reason_code = None
            job.reason = None

    def _on_updated(self, event: JobUpdated, at: float) -> None:
        job = self._jobs.get(event.job_id)
        if job is None or job.spec is None or job.state in TERMINAL_STATES:
            return
        if job.state in HOLDING_STATES:
            return  # the API refuses changes to a job holding GPUs; a late one changes nothing
        spec = event.changes.applied_to(job.spec)
        job.spec = spec
        job.fractional = spec.fractional
        job.gated = _gated(job)
        if event.changes.priority is not None:
            job.priority = spec.priority
            job.priority_changed = True

    def _on_suspend_requested(self, event: JobSuspendRequested, at: float) -> None:
        job = self._jobs.get(event.job_id)
        if job is None or job.state in TERMINAL_STATES or job.state == "suspended":
            return
        job.suspend_requested = True
        job.resume_requested = False
        self._attention.add(job.job_id)

    def _on_resume_requested(self, event: JobResumeRequested, at: float) -> None:
        job = self._jobs.get(event.job_id)
        if job is None or job.state in TERMINAL_STATES:
            return
        if job.state == "suspended":
            job.resume_requested = True
            self._attention.add(job.job_id)
        else:
            job.suspend_requested = False  # resume before the suspension took effect

    def _on_deferred(self, event: JobDeferred, at: float) -> None:
        job = self._jobs.get(event.job_id)
        if job is None or job.state in TERMINAL_STATES:
            return
        job.reason_code = event.code
        job.reason = event.message
        if event.code != NOT_CONSIDERED:
            job.considered = True
        if event.code != RESERVED_HEAD:
            # No longer the head: its reservation (and estimated start) is gone.
            job.estimated_start = None
            job.reserved_nodes = ()

    def _on_reservation_planned(self, event: ReservationPlanned, at: float) -> None:
        job = self._jobs.get(event.job_id)
        if job is None or job.state in TERMINAL_STATES:
            return
        job.estimated_start = event.start_at.timestamp()
        job.reserved_nodes = tuple(event.nodes)

    def _on_gang_reserved(self, event: GangReserved, at: float) -> None:
        job = self._jobs.get(event.job_id)
        if job is None or job.state in TERMINAL_STATES or job.ranks:
            return  # a gang is bound once per attempt; a second one would double-bind
        ranks: list[tuple[int, int]] = []
        fractional: list[RankPlacement] = []
        held: GpuAmount = 0
        for placement in event.ranks:
            node = self._nodes.get(placement.node_id)
            if node is None:
                return  # placed on a node this state never saw: ignore the whole gang
            mask = 0
            if is_fractional(placement):
                # A slice or share holds part of its GPU, in the sharing ledger, not the GPU.
                fractional.append(placement)
                held += placement_gpus(placement)
            else:
                for gpu in placement.gpus:
                    mask |= 1 << gpu
            ranks.append((node.index, mask))
        job.attempt = event.attempt
        job.ranks = ranks
        job.retry_at = None
        job.started_ranks = set()
        job.exit_codes = {}
        job.evicted_ranks = set()
        job.exit_reasons = {}
        job.lost_ranks = set()
        job.agent_lost_ranks = set()
        job.permanent_failure = False
        job.permanent_reason = None
        job.reserved_at = at
        job.started_at = None
        job.preempt_requested_at = None
        job.preemptor_id = None
        job.awaiting_victims = ()
        job.reason_code = None
        job.reason = None
        job.estimated_start = None
        job.reserved_nodes = ()
        for placement in fractional:
            self._sharing.bind(
                job.job_id, event.attempt, placement.rank, placement, job.spec, job.team
            )
        touched: dict[int, int] = {}
        for node_index, mask in ranks:
            touched[node_index] = touched.get(node_index, 0) | mask
        gpus: GpuAmount = held
        for node_index, mask in touched.items():
            node = self._node_list[node_index]
            node.gangs[job.job_id] = node.gangs.get(job.job_id, 0) | mask
            node.bound_mask |= mask
            if fractional:
                node.shared_mask = self._sharing.shared_mask(node.node_id)
            self._refresh(node)
            gpus += popcount(mask)
            if node.lost or (mask & node.unhealthy_mask) or node.draining:
                self._attention.add(job.job_id)
        cpus, memory = rank_host(job.spec)
        if cpus or memory:
            for node_index, _ in ranks:
                host = self._node_list[node_index]
                host.cpus_bound_milli += cpus
                host.memory_bound_mb += memory
        self._allocated += gpus
        job.bound_gpus = gpus
        self._charge(job.queue, gpus, at, cpus * len(ranks), memory * len(ranks))
        self._set_state(job, "reserved")

    def _on_task_started(self, event: TaskStarted, at: float) -> None:
        self._last_rank_started_at = max(self._last_rank_started_at, at)
        job = self._jobs.get(event.job_id)
        if job is None or event.attempt != job.attempt:
            return
        if job.state not in HOLDING_STATES:
            self._started_after_release(job, event)
            return
        if event.rank >= len(job.ranks):
            return
        node_index, mask = job.ranks[event.rank]
        node = self._node_list[node_index]
        if node.unstarted:
            # Its agent starts this gang's rank on those GPUs: a released rank it had not
            # started there before will not be started after it (bounds the map).
            for key, held in list(node.unstarted.items()):
                if held & mask:
                    del node.unstarted[key]
        job.started_ranks.add(event.rank)
        if job.state == "reserved" and len(job.started_ranks) == len(job.ranks):
            job.started_at = at
            self._set_state(job, "running")

    def _on_task_exited(self, event: TaskExited, at: float) -> None:
        self._rank_gone(event)
        job = self._jobs.get(event.job_id)
        if job is None or event.attempt != job.attempt or job.state not in HOLDING_STATES:
            return
        if event.rank >= len(job.ranks):
            return
        job.exit_codes[event.rank] = event.exit_code
        if event.exit_code != 0 and event.reason:
            job.exit_reasons[event.rank] = event.reason
            job.permanent_failure = job.permanent_failure or event.permanent
            if event.reason.startswith(AGENT_RESTARTED):
                job.agent_lost_ranks.add(event.rank)
        if event.out_of_memory and event.exit_code != 0:
            self._ran_out_of_memory(job, event.attempt)
        if event.reason == PREEMPTED_EXIT_REASON:
            job.evicted_ranks.add(event.rank)
        self._attention.add(job.job_id)

    def _ran_out_of_memory(self, job: CoreJob, attempt: int) -> None:
        """Count the attempt against its size; out of memory again at that size is permanent."""
        if job.spec is None:
            return
        size = attempt_size(job.spec, len(job.ranks))
        attempts = job.oom_attempts.setdefault(size, set())
        attempts.add(attempt)
        verdict = repeated_oom(size, attempts)
        if verdict is not None:
            job.permanent_failure = True
            job.permanent_reason = verdict

    def _on_preemption_requested(self, event: PreemptionRequested, at: float) -> None:
        job = self._jobs.get(event.job_id)
        if job is None or event.attempt != job.attempt or job.state not in HOLDING_STATES:
            return
        if job.preempt_requested_at is None:
            job.preempt_requested_at = at
            job.preempt_grace_s = event.grace_s
        job.preemptor_id = event.preemptor_job_id
        job.last_preempted_at = at
        self._set_state(job, "preempting")
        self._attention.add(job.job_id)
        preemptor = self._jobs.get(event.preemptor_job_id or "")
        if preemptor is not None and preemptor.state in WAITING_STATES:
            preemptor.last_preempting_at = at
            if job.job_id not in preemptor.awaiting_victims:
                preemptor.awaiting_victims = (*preemptor.awaiting_victims, job.job_id)
                if self._waiting_watches:
                    self._touch_waiting(preemptor.job_id)

    def _release(self, job: CoreJob, at: float) -> None:
        """Free the gang's GPUs; idempotent (a second release finds nothing bound)."""
        if not job.ranks:
            return
        self._keep_running_ranks(job)
        touched: set[int] = set()
        for node_index, _ in job.ranks:
            touched.add(node_index)
        cpus, memory = rank_host(job.spec)
        if cpus or memory:
            for node_index, _ in job.ranks:
                host = self._node_list[node_index]
                host.cpus_bound_milli -= cpus
                host.memory_bound_mb -= memory
        gpus: GpuAmount = 0
        if job.job_id in self._sharing.by_job:
            still = {rank for rank in range(len(job.ranks)) if job.still_runs(rank)}
            self._sharing.release(job.job_id, job.attempt, still)
            gpus = job.bound_gpus - sum(popcount(mask) for _, mask in job.ranks)
        for node_index in sorted(touched):
            node = self._node_list[node_index]
            mask = node.gangs.pop(job.job_id, 0)
            gpus += popcount(mask)
            node.shared_mask = self._sharing.shared_mask(node.node_id)
            remaining = 0
            for other in node.gangs.values():
                remaining |= other
            node.bound_mask = remaining
            self._refresh(node)
            if node.draining:
                self._draining.add(node_index)
        self._allocated -= gpus
        ranks = len(job.ranks)
        self._charge(job.queue, -gpus, at, -cpus * ranks, -memory * ranks)
        if job.started_at is not None:
            # Folded from the log's own times, so that replay gives the same service.
            job.attained_gpu_s += job.bound_gpus * max(0.0, at - job.started_at)
        job.released_ranks = job.ranks
        job.ranks = []
        job.bound_gpus = 0
        job.started_ranks = set()
        job.exit_codes = {}
        job.evicted_ranks = set()
        job.exit_reasons = {}
        job.lost_ranks = set()
        job.agent_lost_ranks = set()
        job.preempt_requested_at = None

    def _keep_running_ranks(self, job: CoreJob) -> None:
        """A released gang's ranks that started and have not exited still run on their GPUs
        (a rank may take its stop timeout to die): they stay out of placement until their
        TaskExited, so that two attempts never share a GPU on the hardware. Those not started
        yet may still start late (`NodeRecord.unstarted`)."""
        for rank, (node_index, mask) in enumerate(job.ranks):
            node = self._node_list[node_index]
            if node.lost:
                continue
            if job.still_runs(rank):
                node.lingering[(job.job_id, job.attempt, rank)] = mask
                node.lingering_mask |= mask
                self._lingering.add(node_index)
            elif mask and rank not in job.started_ranks and rank not in job.exit_codes:
                node.unstarted[(job.job_id, job.attempt, rank)] = mask

    def _started_after_release(self, job: CoreJob, event: TaskStarted) -> None:
        """A rank its agent launched while the scheduler released the gang (the two race):
        it runs on GPUs already given back, which go to no new gang until it exits."""
        if event.rank >= len(job.released_ranks):
            return
        node_index, mask = job.released_ranks[event.rank]
        node = self._node_list[node_index]
        if node.lost or node.node_id != event.node_id:
            return
        node.unstarted.pop((job.job_id, job.attempt, event.rank), None)
        node.lingering[(job.job_id, job.attempt, event.rank)] = mask
        node.lingering_mask |= mask
        self._lingering.add(node_index)
        self._refresh(node)

    def _rank_gone(self, event: TaskExited) -> None:
        if self._sharing.lingering:
            shared_node = self._sharing.rank_gone((event.job_id, event.attempt, event.rank))
            record = self._nodes.get(shared_node or "")
            if record is not None:
                record.shared_mask = self._sharing.shared_mask(record.node_id)
                self._refresh(record)
        node = self._nodes.get(event.node_id)
        if node is None:
            return
        if node.unstarted:
            node.unstarted.pop((event.job_id, event.attempt, event.rank), None)
        if not node.lingering:
            return
        if node.lingering.pop((event.job_id, event.attempt, event.rank), None) is None:
            return
        remaining = 0
        for mask in node.lingering.values():
            remaining |= mask
        node.lingering_mask = remaining
        if not node.lingering:
            self._lingering.discard(node.index)
        self._refresh(node)

    def _on_requeued(self, event: JobRequeued, at: float) -> None:
        job = self._jobs.get(event.job_id)
        if job is None or job.state in TERMINAL_STATES or event.attempt != job.attempt:
            return
        if job.state not in HOLDING_STATES:
            return
        if job.agent_lost_ranks and event.code in LOST_GANG_REQUEUE_CODES:
            # Counted in a row, each soon after its gang started: one that ran a hysteresis
            # window first (a long job living through a fleet's agent upgrades) starts over.
            ran = at - job.started_at if job.started_at is not None else 0.0
            job.agent_requeues = 1 if ran >= self.policy.hysteresis_s else job.agent_requeues + 1
        self._release(job, at)
        job.requeues += 1
        if event.code in FAILURE_REQUEUE_CODES:
            job.failures += 1
            job.retry_at = at + retry_delay_s(job.job_id, job.failures, self.policy)
            self._latest_retry_at = max(self._latest_retry_at, job.retry_at)
        elif event.code in LOST_GANG_REQUEUE_CODES:
            # Its gang was lost, not taken from it: what it had reclaimed went to others in the
            # cycle that released it. The calm after its evictions guards against thrashing,
            # not against that: it may reclaim again at once (its victims keep their own calm).
            job.last_preempting_at = None
        job.started_at = None
        job.queued_at = at
        job.considered = False
        job.reason_code = event.code
        job.reason = event.reason
        self._set_state(job, "queued")
        self._attention.discard(job.job_id)
        if job.cancel_requested or job.suspend_requested:
            self._attention.add(job.job_id)

    def _on_suspended(self, event: JobSuspended, at: float) -> None:
        job = self._jobs.get(event.job_id)
        if job is None or job.state in TERMINAL_STATES:
            return
        self._release(job, at)
        job.suspend_requested = False
        job.started_at = None
        job.reason_code = "suspended"
        job.reason = "suspended by request; resume to queue it again"
        # No longer the head: its reservation (and estimated start) is gone, and once resumed
        # it records a new one rather than stating the stale one.
        job.estimated_start = None
        job.reserved_nodes = ()
        self._set_state(job, "suspended")
        self._attention.discard(job.job_id)
        if job.cancel_requested or job.resume_requested:
            self._attention.add(job.job_id)

    def _on_resumed(self, event: JobResumed, at: float) -> None:
        job = self._jobs.get(event.job_id)
        if job is None or job.state != "suspended":
            return
        job.resume_requested = False
        job.queued_at = at
        job.considered = False
        job.reason_code = "queued"
        job.reason = "resumed; waiting for the next scheduling cycle"
        self._set_state(job, "queued" if job.admitted else "pending")

    def _finish(self, job: CoreJob, state: JobStateName, at: float, reason: str | None) -> None:
        self._release(job, at)
        job.finished_at = at
        job.reason_code = None if state == "succeeded" else state
        job.reason = reason
        job.estimated_start = None
        job.reserved_nodes = ()
        job.awaiting_victims = ()
        self._set_state(job, state)
        self._attention.discard(job.job_id)

    def _on_succeeded(self, event: JobSucceeded, at: float) -> None:
        job = self._jobs.get(event.job_id)
        if job is None or job.state in TERMINAL_STATES:
            return
        self._finish(job, "succeeded", at, None)

    def _on_failed(self, event: JobFailed, at: float) -> None:
        job = self._jobs.get(event.job_id)
        if job is None or job.state in TERMINAL_STATES:
            return
        self._finish(job, "failed", at, event.reason)

    def _on_cancelled(self, event: JobCancelled, at: float) -> None:
        job = self._jobs.get(event.job_id)
        if job is None or job.state in TERMINAL_STATES:
            return
        self._finish(job, "cancelled", at, event.reason)

    # ---------------------------------------------------------------- nodes

    def _refresh(self, node: NodeRecord, topology_changed: bool = False) -> None:
        if topology_changed:
            self._node_generation += 1
        self._sharing.sync(
            node.node_id,
            node.bound_mask | node.lingering_mask,
            node.unhealthy_mask,
            node.schedulable,
        )
        free = node.free_mask
        if free:
            self._free[node.index] = free
        else:
            self._free.pop(node.index, None)
        for watch in self._free_watches:
            if watch.changed is not None:
                watch.changed.add(node.index)

    def _flag_gangs(self, node: NodeRecord, mask: int | None = None) -> None:
        for job_id, held in node.gangs.items():
            if mask is None or held & mask:
                self._attention.add(job_id)

    def _on_node_registered(self, event: NodeRegistered, at: float) -> None:
        all_mask = 0
        for gpu in event.gpus:
            all_mask |= 1 << gpu.index
        node = self._nodes.get(event.node_id)
        if node is None:
            node = NodeRecord(
                index=len(self._node_list),
                node_id=event.node_id,
                hostname=event.hostname,
                gpu_type=event.gpu_type,
                rack=event.rack,
                block=event.block,
                gpu_count=popcount(all_mask),
                all_mask=all_mask,
                labels=dict(event.labels),
                nvlink=event.nvlink,
            )
            _declare_host(node, event)
            self._nodes[event.node_id] = node
            self._node_list.append(node)
            self._place_in_topology(node)
            self._total += node.gpu_count
        else:
            # A re-registration: topology may be corrected, the node is evidently up again.
            if node.lost:
                node.lost = False
                self._lost_gpus -= node.gpu_count
            self._total += popcount(all_mask) - node.gpu_count
            node.hostname = event.hostname
            node.gpu_type = event.gpu_type
            node.nvlink = event.nvlink
            node.rack = event.rack
            node.block = event.block
            node.gpu_count = popcount(all_mask)
            node.all_mask = all_mask
            node.labels = dict(event.labels)
            _declare_host(node, event)
            self._place_in_topology(node)
            for watch in self._free_watches:
                watch.changed = None  # its rack, block or pool may have changed
        if not event.nvlink and not self._pcie_nodes:
            self._shape_for_pcie_nodes()
        self._sharing.register(event)
        node.shared_mask = self._sharing.shared_mask(node.node_id)
        self._refresh(node, topology_changed=True)

    def _shape_for_pcie_nodes(self) -> None:
        """The first node whose GPUs NVLink does not join: from now on a tp gang's shape asks
        for NVLink (core/shape.py `Shape.nvlink`), so the jobs known already are shaped anew.
        It stays so if that node leaves: once, not every time the fleet changes."""
        self._pcie_nodes = True
        for job in self._jobs.values():
            if job.spec is not None and job.shape is not None and needs_nvlink(job.spec):
                job.shape = _one_shape(shape_of(job.spec))

    def _place_in_topology(self, node: NodeRecord) -> None:
        node.pool = pool_of(node.gpu_type, node.nvlink)
        rack_key = (node.pool, node.block, node.rack)
        block_key = (node.pool, node.block)
        node.rack_id = self._rack_ids.setdefault(rack_key, len(self._rack_ids))
        node.block_id = self._block_ids.setdefault(block_key, len(self._block_ids))

    def _on_node_lost(self, event: NodeLost, at: float) -> None:
        node = self._nodes.get(event.node_id)
        if node is None or node.lost:
            return
        node.lost = True
        # Whatever ran there is gone with the node, even if it comes back before its gangs
        # are released: those ranks must not hold its GPUs as lingering ones then.
        node.lingering.clear()
        node.lingering_mask = 0
        node.unstarted.clear()
        self._lingering.discard(node.index)
        self._sharing.node_lost(node.node_id)
        node.shared_mask = self._sharing.shared_mask(node.node_id)
        for job_id in node.gangs:
            job = self._jobs[job_id]
            for rank, (node_index, _) in enumerate(job.ranks):
                if node_index == node.index and rank in job.started_ranks:
                    job.lost_ranks.add(rank)
        self._lost_gpus += node.gpu_count
        self._refresh(node, topology_changed=True)
        self._flag_gangs(node)

    def _on_node_recovered(self, event: NodeRecovered, at: float) -> None:
        node = self._nodes.get(event.node_id)
        if node is None or not node.lost:
            return
        node.lost = False
        self._lost_gpus -= node.gpu_count
        self._refresh(node, topology_changed=True)

    def _on_drain_requested(self, event: NodeDrainRequested, at: float) -> None:
        node = self._nodes.get(event.node_id)
        if node is None or node.drained:
            return
        node.draining = True
        node.drain_deadline = None if event.deadline is None else event.deadline.timestamp()
        self._draining.add(node.index)
        self._refresh(node, topology_changed=True)
        self._flag_gangs(node)

    def _on_drained(self, event: NodeDrained, at: float) -> None:
        node = self._nodes.get(event.node_id)
        if node is None:
            return
        node.drained = True
        node.draining = False
        self._draining.discard(node.index)
        self._refresh(node, topology_changed=True)

    def _on_undrained(self, event: NodeUndrained, at: float) -> None:
        node = self._nodes.get(event.node_id)
        if node is None:
            return
        node.drained = False
        node.draining = False
        node.drain_deadline = None
        self._draining.discard(node.index)
        self._refresh(node, topology_changed=True)

    def _on_gpu_unhealthy(self, event: GpuUnhealthy, at: float) -> None:
        node = self._nodes.get(event.node_id)
        if node is None:
            return
        bit = 1 << event.gpu_index
        if not bit & node.all_mask or bit & node.unhealthy_mask:
            return
        node.unhealthy_mask |= bit
        self._refresh(node, topology_changed=True)
        self._flag_gangs(node, bit)
        for job_id in self._sharing.jobs_on(node.node_id, event.gpu_index):
            self._attention.add(job_id)

    def _on_gpu_recovered(self, event: GpuRecovered, at: float) -> None:
        node = self._nodes.get(event.node_id)
        if node is None:
            return
        node.unhealthy_mask &= ~(1 << event.gpu_index)
        self._refresh(node, topology_changed=True)

    def _on_geometry_changed(self, event: GpuGeometryChanged, at: float) -> None:
        node = self._nodes.get(event.node_id)
        if node is None or not self._sharing.set_geometry(event, at):
            return
        node.shared_mask = self._sharing.shared_mask(node.node_id)
        self._refresh(node)

    # ---------------------------------------------------------------- queues

    def _queue(self, name: str) -> QueueRecord:
        record = self._queues.get(name)
        if record is None:
            record = QueueRecord(name=name)
            self._queues[name] = record
        return record

    def _on_team_created(self, event: TeamCreated, at: float) -> None:
        queue = self._queue(event.name)
        queue.parent = event.parent
        queue.guaranteed_gpus = event.guaranteed_gpus
        queue.max_gpus = event.max_gpus
        queue.configured = True
        if event.parent is not None:
            self._queue(event.parent)

    def _on_queue_configured(self, event: QueueConfigured, at: float) -> None:
        queue = self._queue(event.name)
        queue.parent = event.parent
        queue.guaranteed_gpus = event.guaranteed_gpus
        queue.max_gpus = event.max_gpus
        queue.weight = event.weight
        queue.max_cpus_milli = None if event.max_cpus is None else event.max_cpus * 1000
        queue.max_memory_mb = event.max_memory_mb
        queue.configured = True
        if event.parent is not None:
            self._queue(event.parent)

    def _charge(
        self,
        queue_name: str,
        gpus: GpuAmount,
        at: float,
        cpus_milli: int = 0,
        memory_mb: int = 0,
    ) -> None:
        """Account `gpus` more (or fewer) GPUs (exact fractions for slices and shares), and the
        ranks' CPUs and memory, to the queue and decay its usage up to `at`."""
        queue = self._queue(queue_name)
        self._decay(queue, at)
        queue.allocated += gpus
        queue.allocated_cpus_milli += cpus_milli
        queue.allocated_memory_mb += memory_mb

    def _decay(self, queue: QueueRecord, at: float) -> None:
        elapsed = at - queue.usage_at
        half_life = self.policy.fair_share_half_life_s
        queue.decayed_usage = decayed_usage(
            queue.decayed_usage, queue.allocated, elapsed, half_life
        )
        if queue.allocated_cpus_milli or queue.decayed_cpu_usage:
            queue.decayed_cpu_usage = decayed_usage(
                queue.decayed_cpu_usage, queue.allocated_cpus_milli, elapsed, half_life
            )
        if queue.allocated_memory_mb or queue.decayed_memory_usage:
            queue.decayed_memory_usage = decayed_usage(
                queue.decayed_memory_usage, queue.allocated_memory_mb, elapsed, half_life
            )
        queue.usage_at = max(queue.usage_at, at)


def _awaits_admission(job: CoreJob) -> bool:
    """Whether admission's decision still applies to the job: it waits for it, or was
    suspended before it came (admission catching up late, after an outage); a decision after
    the job's end is none."""
    return not job.admitted and job.state in ("pending", "suspended")


def _gated(job: CoreJob) -> bool:
    spec = job.spec
    if job.held or (spec is not None and spec.depends_on):
        return True
    bounded = spec is not None and spec.array is not None and spec.array.max_parallel is not None
    return job.array_id is not None and bounded


# What the head's reservation plan reads of a holding gang with an estimated end of its own
# (core/reservation.py `gang_ends`), kept by the planner's timers while the gang holds:
# (ranks, each rank's host ask, since when it holds its GPUs, its spec, and what its estimate
# rests on when that is its given estimate scaled by its team's ratio: team, estimate, limit).
HeldGang = tuple[
    list[tuple[int, int]],
    tuple[int, int],
    float,
    "JobSpec | None",
    "tuple[str, float, float | None] | None",
]


def rank_host(spec: JobSpec | None) -> tuple[int, int]:
    """What one rank of the job asks of its node's host: thousandths of a CPU, MB of memory."""
    if spec is None:
        return 0, 0
    cpus = spec.cpus_per_task
    return (0 if cpus is None else round(cpus * 1000)), spec.memory_mb_per_task or 0


def _declare_host(node: NodeRecord, event: NodeRegistered) -> None:
    node.cpus_milli = None if event.cpus is None else event.cpus * 1000
    node.memory_mb = event.memory_mb


def decayed_usage(
    previous: float, allocated: GpuAmount, elapsed: float, half_life_s: float
) -> float:
    """GPU·seconds with exponential decay: usage `elapsed` seconds later at constant `allocated`."""
    if elapsed <= 0:
        return previous
    rate = math.log(2) / half_life_s
    decay = math.exp(-rate * elapsed)
    return previous * decay + float(allocated) * (1.0 - decay) / rate


def _node_view(node: NodeRecord) -> NodeView:
    bound = node.bound_mask & node.all_mask
    return NodeView(
        node_id=node.node_id,
        hostname=node.hostname,
        gpu_type=node.gpu_type,
        rack=node.rack,
        block=node.block,
        state=node.state,
        gpus=node.gpu_count,
        free_gpus=popcount(node.free_mask),
        allocated_gpus=popcount(bound),
        unhealthy_gpus=tuple(bits(node.unhealthy_mask)),
        gangs=tuple(node.gangs),
        labels=dict(node.labels),
    )
