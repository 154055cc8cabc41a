"""The simulation loop: a trace replayed through the real scheduling core in simulated time.

Event-driven: a heap holds what will happen (a submission, ranks exiting, a wake-up the core
asked for). At each distinct timestamp the simulator applies every event due, runs one
scheduling cycle, applies its decisions and lets the simulated agents react to them:

- GangReserved at t → TaskStarted for every rank at t; the ranks exit 0 at t + the job's
  remaining work.
- PreemptionRequested at t → the job stops and writes a checkpoint of its progress at t, which
  takes `checkpoint_write_s`; its ranks exit with reason "preempted" when the write ends, or at
  the grace deadline if the write is longer than the grace (then the request's checkpoint is
  lost and the job falls back to its last periodic checkpoint). A job that would end before
  its eviction just ends (exit 0); if the core requeues it anyway, its work stays done and its
  next attempt is empty.
- JobRequeued → the job will resume from its last checkpoint; the work since that checkpoint
  is redone and counted in `lost_gpu_s`. Periodic checkpoints happen every
  `checkpoint_interval_s` of an attempt's run time.

Every event, input or decision, goes through the core's Auditor; its violations are reported.
Admission runs the admission service's pure rules, so that a job no placement or ceiling could
ever allow is rejected as the real system would reject it, rather than waiting forever.
"""

from __future__ import annotations

import hashlib
import heapq
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from core import Auditor, SchedulerState, SchedulingPolicy, schedule
from core.admission import AdmissionCatalog, admit
from gangway.simulator.metrics import JobRecord
from gangway.simulator.quotas import Quota
from gangway.simulator.trace import TraceJob
from schemas.base import Event
from schemas.jobs import (
    GangReserved,
    JobAdmitted,
    JobCancelled,
    JobFailed,
    JobRejected,
    JobRequeued,
    JobSubmitted,
    JobSucceeded,
    JobSuspended,
    PreemptionRequested,
    ReservationPlanned,
    TaskExited,
    TaskStarted,
)
from schemas.nodes import NodeRegistered
from schemas.teams import TeamCreated

# Heap entry kinds, in the order they are recorded within one timestamp (the heap sorts by time,
# then kind, then push order). Everything due at a timestamp is applied before its one cycle,
# so the order only fixes how the log reads: ranks leave before new jobs arrive.
_EXIT = 0
_PREEMPT_EXIT = 1
_SUBMIT = 2
_WAKE = 3

PREEMPTED = "preempted"
# Ranks evicted after their checkpoint exit as if terminated (128 + SIGTERM): a non-zero code is
# what tells the core the gang did not simply finish while it was being preempted.
PREEMPTED_EXIT_CODE = 143


@dataclass(frozen=True, slots=True)
class SimulationConfig:
    # Periodic checkpoints, in seconds of an attempt's run time: bounds the work a failure loses.
    checkpoint_interval_s: float = 1800.0
    # How long a checkpoint on preemption takes to write (the ranks exit when it is written).
    checkpoint_write_s: float = 30.0


@dataclass(slots=True)
class _Job:
    """The simulated agents' side of one job."""

    trace: TraceJob
    record: JobRecord
    remaining_s: float
    attempt: int = 0
    running_since: float | None = None
    ranks: list[tuple[int, str]] = field(default_factory=list)
    # Bumped whenever the pending exits of an attempt become stale (requeue, preemption).
    token: int = 0
    # Set on a preemption request: when training stopped, and when its checkpoint is written
    # (None when the write cannot finish within the grace period).
    stopped_at: float | None = None
    checkpoint_ready_at: float | None = None
    # The current attempt's ranks exited 0: the job's work is complete.
    work_done: bool = False
    # The current attempt's ranks run (started, their exit not recorded yet).
    ranks_running: bool = False


@dataclass(slots=True)
class SimulationResult:
    records: list[JobRecord]
    capacity_gpus: int
    allocated_gpu_s: float
    end_s: float
    preemptions: int
    lost_gpu_s: float
    violations: list[str]
    events: int
    cycles: int
    wall_s: float
    # (time, GPUs allocated) after every timestamp where the allocation changed.
    timeline: list[tuple[float, int]]


Progress = Callable[[int, float], None]


class Simulation:
    def __init__(
        self,
        jobs: Sequence[TraceJob],
        nodes: Sequence[NodeRegistered],
        *,
        policy: SchedulingPolicy,
        quotas: dict[str, Quota] | None = None,
        config: SimulationConfig | None = None,
        keep_log: bool = False,
    ) -> None:
        if not nodes:
            raise ValueError("the cluster has no nodes")
        self._policy = policy
        self._config = config or SimulationConfig()
        self._nodes = list(nodes)
        self._node_gpus = {node.node_id: len(node.gpus) for node in nodes}
        self._capacity = sum(self._node_gpus.values())
        self._quotas = quotas
        self._jobs = {job.job_id: _Job(job, _record(job), job.duration_s) for job in jobs}
        self._state = SchedulerState(policy)
        self._auditor = Auditor(policy)
        self._catalog = AdmissionCatalog()
        self._classes = [pc.name for pc in policy.priority_classes]
        self._heap: list[tuple[float, int, int, str, int]] = []
        self._seq = 0
        self._wakes: set[float] = set()
        self._position = 0
        self._allocated = 0
        self._allocated_gpu_s = 0.0
        self._held: dict[str, tuple[float, int]] = {}  # job → (reserved at, GPUs)
        self._preemptions = 0
        self._lost_gpu_s = 0.0
        self._finished = 0
        self._cycles = 0
        self._timeline: list[tuple[float, int]] = []
        # Every recorded event with its time, when asked for (tests, debugging): memory grows
        # with the trace, so a long run leaves it off.
        self.log: list[tuple[float, Event]] | None = [] if keep_log else None

    # The loop.

    def run(self, progress: Progress | None = None) -> SimulationResult:
        began = time.perf_counter()
        records = [job.record for job in self._jobs.values()]
        start = min((job.trace.submit_s for job in self._jobs.values()), default=0.0)
        self._setup(start)
        for job in self._jobs.values():
            self._push(job.trace.submit_s, _SUBMIT, job.trace.job_id)
        now = start
        heap = self._heap
        while heap:
            now = heap[0][0]
            changed = False
            while heap and heap[0][0] == now:
                _, kind, _, job_id, token = heapq.heappop(heap)
                changed |= self._handle(kind, job_id, token, now)
            if changed:
                self._cycle(now)
            if not self._timeline or self._timeline[-1][1] != self._allocated:
                self._timeline.append((now, self._allocated))
            if progress is not None:
                progress(self._finished, now)
        return SimulationResult(
            records=records,
            capacity_gpus=self._capacity,
            allocated_gpu_s=self._allocated_gpu_s,
            end_s=now,
            preemptions=self._preemptions,
            lost_gpu_s=self._lost_gpu_s,
            violations=[str(violation) for violation in self._auditor.violations],
            events=self._position,
            cycles=self._cycles,
            wall_s=time.perf_counter() - began,
            timeline=self._timeline,
        )

    def _setup(self, at: float) -> None:
        for node in self._nodes:
            self._record(node, at)
        tenants = sorted({job.trace.tenant for job in self._jobs.values()})
        # The fifo baseline ignores quotas (no ceilings, no reclaiming), so under it the teams
        # carry none: a guarantee no fifo cycle can honour would only make the auditor flag
        # invariant 4 for a policy that never promised it.
        quotas = self._quotas if not self._policy.is_fifo else None
        for tenant in tenants:
            quota = quotas.get(tenant) if quotas is not None else None
            self._record(
                TeamCreated(
                    name=tenant,
                    # Without a quota every tenant is a team with no guarantee and no ceiling:
                    # pure fair share between tenants.
                    guaranteed_gpus=quota.guaranteed_gpus if quota else 0,
                    max_gpus=quota.max_gpus if quota else None,
                    # A simulation has no secrets; the hash only satisfies the event's shape.
                    token_sha256=hashlib.sha256(tenant.encode()).hexdigest(),
                ),
                at,
            )

    def _push(self, at: float, kind: int, job_id: str, token: int = 0) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (at, kind, self._seq, job_id, token))

    def _handle(self, kind: int, job_id: str, token: int, now: float) -> bool:
        """Apply one due heap entry; True when it changed what the core knows."""
        if kind == _WAKE:
            self._wakes.discard(now)
            return True
        job = self._jobs[job_id]
        if kind == _SUBMIT:
            return self._submit(job, now)
        if token != job.token:
            return False  # a stale exit of an attempt that was requeued or preempted
        preempted = kind == _PREEMPT_EXIT
        # Ranks exiting 0 have done all the job's work: the core records the job succeeded even
        # while it was being evicted, since no rank reported the eviction as its reason.
        job.work_done = not preempted
        for rank, node_id in job.ranks:
            self._record(
                TaskExited(
                    job_id=job_id,
                    attempt=job.attempt,
                    rank=rank,
                    node_id=node_id,
                    exit_code=PREEMPTED_EXIT_CODE if preempted else 0,
                    reason=PREEMPTED if preempted else None,
                ),
                now,
            )
        job.token += 1  # the ranks are gone; nothing else of this attempt may exit
        job.ranks_running = False
        return True

    def _submit(self, job: _Job, now: float) -> bool:
        trace = job.trace
        submitted = JobSubmitted(job_id=trace.job_id, spec=trace.spec, submitted_by="trace")
        self._record(submitted, now)
        self._record(self._admit(trace), now)
        if job.record.outcome == "rejected":
            job.record.finish_s = now
            self._finished += 1
        return True

    def _admit(self, trace: TraceJob) -> JobAdmitted | JobRejected:
        """The admission service's pure rules' verdict."""
        verdict = admit(trace.job_id, trace.spec, self._catalog, self._classes)
        if isinstance(verdict, JobRejected):
            self._jobs[trace.job_id].record.outcome = "rejected"
        return verdict

    def _cycle(self, now: float) -> None:
        self._cycles += 1
        result = schedule(self._state, now)
        started: list[GangReserved] = []
        for decision in result.decisions:
            self._record(decision, now)
            if isinstance(decision, GangReserved):
                started.append(decision)
        # The agents launch the ranks once the whole cycle is recorded, as real agents would
        # after reading the decisions from the log.
        for reserved in started:
            self._start(reserved, now)
        # Time-driven decisions (aging, reservation starts, preemption deadlines) need a cycle
        # even when no event arrives; the core says when the next one could decide something.
        if result.next_wakeup is not None and now < result.next_wakeup < float("inf"):
            self._wake(result.next_wakeup)

    # Recording: every event goes to the auditor, the core's state and the admission catalogue.

    def _record(self, event: Event, at: float) -> None:
        self._auditor.observe(event, position=self._position, at=at, epoch=None)
        self._position += 1
        self._state.apply(event, at)
        if self.log is not None:
            self.log.append((at, event))
        match event:
            case NodeRegistered() | TeamCreated():
                self._catalog.apply(event)
            case GangReserved():
                gpus = sum(len(rank.gpus) for rank in event.ranks)
                self._held[event.job_id] = (at, gpus)
                self._allocated += gpus
            case PreemptionRequested():
                self._preemptions += 1
                self._preempt(event, at)
            case JobRequeued():
                self._release(event.job_id, at)
                self._stop_ranks(event.job_id, at)
                self._requeue(event, at)
            case JobSuspended():
                self._release(event.job_id, at)
                self._stop_ranks(event.job_id, at)
            case JobSucceeded() | JobFailed() | JobCancelled():
                self._release(event.job_id, at)
                self._stop_ranks(event.job_id, at)
                self._finish(event, at)
            case ReservationPlanned():
                self._wake(_seconds(event.start_at))
            case _:
                pass

    def _wake(self, at: float) -> None:
        if at not in self._wakes:
            self._wakes.add(at)
            self._push(at, _WAKE, "")

    def _release(self, job_id: str, at: float) -> None:
        held = self._held.pop(job_id, None)
        if held is not None:
            since, gpus = held
            self._allocated -= gpus
            self._allocated_gpu_s += gpus * (at - since)

    # The simulated agents.

    def _stop_ranks(self, job_id: str, now: float) -> None:
        """A released gang's ranks still running are stopped, and their exits recorded: the
        core gives their GPUs to no other gang until then."""
        job = self._jobs.get(job_id)
        if job is None or not job.ranks_running:
            return
        job.ranks_running = False
        for rank, node_id in job.ranks:
            self._record(
                TaskExited(
                    job_id=job_id,
                    attempt=job.attempt,
                    rank=rank,
                    node_id=node_id,
                    exit_code=PREEMPTED_EXIT_CODE,
                    reason="stopped",
                ),
                now,
            )

    def _start(self, reserved: GangReserved, now: float) -> None:
        job = self._jobs[reserved.job_id]
        job.attempt = reserved.attempt
        job.running_since = now
        job.stopped_at = None
        job.checkpoint_ready_at = None
        job.work_done = False
        job.ranks = [(rank.rank, rank.node_id) for rank in reserved.ranks]
        job.ranks_running = True
        job.record.attempts += 1
        if job.record.first_start_s is None:
            job.record.first_start_s = now
        for rank, node_id in job.ranks:
            self._record(
                TaskStarted(
                    job_id=reserved.job_id, attempt=job.attempt, rank=rank, node_id=node_id
                ),
                now,
            )
        job.token += 1
        self._push(now + job.remaining_s, _EXIT, reserved.job_id, job.token)

    def _preempt(self, request: PreemptionRequested, now: float) -> None:
        job = self._jobs[request.job_id]
        if job.running_since is None or request.attempt != job.attempt:
            return
        job.record.preemptions += 1
        ends_at = job.running_since + job.remaining_s
        write = self._config.checkpoint_write_s
        exit_at = now + min(write, request.grace_s)
        if ends_at <= exit_at:
            return  # it finishes before it could be evicted: let it exit 0
        # The job stops training to write its checkpoint; the write only counts if it ends
        # within the grace period.
        job.stopped_at = now
        job.checkpoint_ready_at = now + write if write <= request.grace_s else None
        job.token += 1
        self._push(exit_at, _PREEMPT_EXIT, request.job_id, job.token)
        if job.checkpoint_ready_at is None:
            # The core acts on the grace deadline; make sure it gets a cycle then.
            self._wake(now + request.grace_s)

    def _requeue(self, event: JobRequeued, now: float) -> None:
        job = self._jobs[event.job_id]
        if job.running_since is None:
            return
        stopped = job.stopped_at if job.stopped_at is not None else now
        worked = min(stopped - job.running_since, job.remaining_s)
        if job.work_done:
            worked = saved = job.remaining_s
        elif job.checkpoint_ready_at is not None and now >= job.checkpoint_ready_at:
            saved = worked
        else:
            interval = self._config.checkpoint_interval_s
            saved = (worked // interval) * interval if interval > 0 else 0.0
        # Work since the checkpoint must be redone; time spent writing the checkpoint is
        # overhead, not lost work.
        self._lost_gpu_s += job.trace.num_gpus * (worked - saved)
        job.remaining_s -= saved
        job.running_since = None
        job.stopped_at = None
        job.checkpoint_ready_at = None
        job.work_done = False
        job.ranks = []
        job.token += 1  # any exit still in the heap belongs to the released attempt

    def _finish(self, event: JobSucceeded | JobFailed | JobCancelled, now: float) -> None:
        job = self._jobs[event.job_id]
        record = job.record
        if record.outcome is not None:
            return
        record.outcome = {
            JobSucceeded: "succeeded",
            JobFailed: "failed",
            JobCancelled: "cancelled",
        }[type(event)]
        record.finish_s = now
        job.running_since = None
        job.token += 1
        self._finished += 1


def _record(job: TraceJob) -> JobRecord:
    return JobRecord(
        job_id=job.job_id,
        tenant=job.tenant,
        priority=job.priority,
        num_gpus=job.num_gpus,
        submit_s=job.submit_s,
    )


def _seconds(moment: datetime) -> float:
    return moment.timestamp()
