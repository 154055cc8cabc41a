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
  is redone and counted in `lost_gpu_s` (preemption, drains) or `lost_gpu_s_failures` (a lost
  node or GPU). Periodic checkpoints happen every `checkpoint_interval_s` of an attempt's
  work, or at the Young-Daly interval of the gang's failure rate ("auto").
- Failure injection (`FailureConfig`): nodes and GPUs fail (NodeLost, GpuUnhealthy into the
  same core, which requeues the gangs on them whole) and come back after a repair time. With
  failures on, writing a periodic checkpoint stops the job for `checkpoint_write_s`: that
  price of protection counts in `lost_gpu_s_failures` too (without failures no periodic
  checkpoint is ever needed, and runs keep the cost-free model, so their figures are
  unchanged).
- Baselines (`baseline=`): the core orders waiting jobs by a key the simulator gives (arrival,
  or the trace's true runtime for the oracles, see baselines.py); for srtf-oracle the
  simulator also evicts the running jobs with the longest remaining work when shorter work
  waits, recording PreemptionRequested before the cycle.

Every event, input or decision, goes through the core's Auditor; its violations are reported.
Admission runs the admission service's pure rules, so that a job no placement or ceiling could
ever allow is rejected as the real system would reject it, rather than waiting forever.
"""

from __future__ import annotations

import hashlib
import heapq
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final, Literal

from core import Auditor, Planner, SchedulerState, SchedulingPolicy
from core.admission import AdmissionCatalog, admit
from core.live_sharing import GpuAmount, as_number, placement_gpus
from gangway.simulator.baselines import (
    Baseline,
    Candidate,
    OrderFacts,
    baseline_policy,
    order_key,
    srtf_preemptions,
)
from gangway.simulator.failures import (
    FailureConfig,
    FailureStream,
    failure_streams,
    young_daly_interval,
)
from gangway.simulator.metrics import SimJobMetrics, compute_metrics
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
from schemas.nodes import GpuRecovered, GpuUnhealthy, NodeLost, NodeRecovered, NodeRegistered
from schemas.teams import TeamCreated
from services.runtime.collector import gc_paused

# Heap entry kinds, in the order they are recorded within one timestamp (the heap sorts by time,
# then kind, then push order). Everything due at a timestamp is applied before its one cycle,
# so the order only fixes how the log reads: ranks leave, hardware fails or comes back, then
# new jobs arrive. A failure or repair entry carries the node id and the GPU index (-1: node).
_EXIT = 0
_PREEMPT_EXIT = 1
_FAILURE = 2
_REPAIR = 3
_SUBMIT = 4
_WAKE = 5
_WHOLE_NODE = -1

PREEMPTED = "preempted"
# Requeue codes of the core that mean the hardware failed under the gang.
_FAILURE_CODES = frozenset({"node_lost", "gpu_unhealthy"})
# Ranks evicted after their checkpoint exit as if terminated (128 + SIGTERM): a non-zero code is
# what tells the core the gang did not simply finish while it was being preempted.
PREEMPTED_EXIT_CODE = 143


AUTO: Final = "auto"


@dataclass(frozen=True, slots=True)
class SimulationConfig:
    # Periodic checkpoints, in seconds of an attempt's work: bounds the work a failure loses.
    # "auto": the Young-Daly interval of each gang from the checkpoint cost and its nodes'
    # failure rate.
    checkpoint_interval_s: float | Literal["auto"] = 1800.0
    # How long a checkpoint takes to write (on preemption the ranks exit when it is written).
    checkpoint_write_s: float = 30.0
    failures: FailureConfig = field(default_factory=FailureConfig)

    def __post_init__(self) -> None:
        interval = self.checkpoint_interval_s
        if interval != AUTO and (isinstance(interval, str) or not interval > 0):
            raise ValueError("the checkpoint interval must be > 0 seconds or 'auto'")
        if self.checkpoint_write_s < 0:
            raise ValueError("the checkpoint write time must be >= 0")
        if interval == AUTO and self.checkpoint_write_s <= 0:
            raise ValueError("an 'auto' checkpoint interval needs a checkpoint write time > 0")


@dataclass(slots=True)
class _Job:
    """The simulated agents' side of one job."""

    trace: TraceJob
    record: SimJobMetrics
    remaining_s: float
    attempt: int = 0
    running_since: float | None = None
    ranks: list[tuple[int, str]] = field(default_factory=list)
    # The current attempt: its periodic checkpoint interval, what each periodic checkpoint
    # stops the job for, and when its ranks exit 0 if nothing interrupts them.
    interval_s: float = math.inf
    checkpoint_cost_s: float = 0.0
    ends_at: float = 0.0
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
    records: list[SimJobMetrics]
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
    timeline: list[tuple[float, int | float]]
    # Failure injection: GPU-seconds of work redone after failures plus those spent writing
    # periodic checkpoints, and how many node and GPU failures struck.
    lost_gpu_s_failures: float = 0.0
    failure_rework_gpu_s: float = 0.0
    checkpoint_write_gpu_s: float = 0.0
    node_failures: int = 0
    gpu_failures: int = 0

    def metrics(self, wall_s: float) -> dict[str, Any]:
        """The run's JSON document (`compute_metrics`), `wall_s` as the caller timed it."""
        return compute_metrics(
            self.records,
            capacity_gpus=self.capacity_gpus,
            allocated_gpu_s=self.allocated_gpu_s,
            preemptions=self.preemptions,
            lost_gpu_s=self.lost_gpu_s,
            lost_gpu_s_failures=self.lost_gpu_s_failures,
            invariant_violations=len(self.violations),
            wall_s=wall_s,
        )


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
        baseline: Baseline | None = None,
        keep_log: bool = False,
    ) -> None:
        if not nodes:
            raise ValueError("the cluster has no nodes")
        if baseline is not None:
            policy = baseline_policy(policy, order_key(baseline, self._order_facts))
        self._policy = policy
        self._srtf = baseline == "srtf-oracle"
        self._config = config or SimulationConfig()
        self._nodes = list(nodes)
        self._node_gpus = {node.node_id: len(node.gpus) for node in nodes}
        self._capacity = sum(self._node_gpus.values())
        self._quotas = quotas
        with gc_paused():  # as in `run`: tens of thousands of records, no cyclic garbage
            self._jobs = {job.job_id: _Job(job, _record(job), job.duration_s) for job in jobs}
        self._state = SchedulerState(policy)
        self._planner = Planner()
        self._auditor = Auditor(policy)
        self._catalog = AdmissionCatalog()
        self._classes = [pc.name for pc in policy.priority_classes]
        self._heap: list[tuple[float, int, int, str, int]] = []
        self._seq = 0
        self._wakes: set[float] = set()
        # The one wake-up the last cycle asked for (`next_wakeup`): each cycle's replaces the
        # one before, as the scheduler service keeps only its last cycle's. Its heap entry
        # carries this token; an entry of an earlier cycle is stale and wakes nothing.
        self._cycle_wake: float | None = None
        self._cycle_wake_token = 0
        self._position = 0
        self._allocated: GpuAmount = 0
        self._allocated_gpu_s = 0.0
        self._held: dict[str, tuple[float, GpuAmount]] = {}  # job → (reserved at, GPUs)
        self._preemptions = 0
        self._lost_gpu_s = 0.0
        self._finished = 0
        self._cycles = 0
        self._timeline: list[tuple[float, int | float]] = []
        failures = self._config.failures
        self._streams: list[FailureStream] = failure_streams(
            failures, [(node.node_id, len(node.gpus)) for node in self._nodes]
        )
        # The stream of each failure in the heap, by its sequence number: a failure handled
        # draws the next one of its stream.
        self._stream_of: dict[int, FailureStream] = {}
        self._down_nodes: set[str] = set()
        self._down_gpus: set[tuple[str, int]] = set()
        self._node_failures = 0
        self._gpu_failures = 0
        self._rework_gpu_s = 0.0
        self._checkpoint_gpu_s = 0.0
        # srtf-oracle: jobs waiting and running, and the groups a job joined the waiting of.
        self._waiting: dict[str, None] = {}
        self._running: dict[str, None] = {}
        self._joined: set[str] = set()
        # Every recorded event with its time, when asked for (tests, debugging): memory grows
        # with the trace, so a long run leaves it off.
        self.log: list[tuple[float, Event]] | None = [] if keep_log else None

    # The loop.

    def run(self, progress: Progress | None = None) -> SimulationResult:
        # The collector stays paused for the whole run, not only in the cycles: the simulation
        # makes next to no cyclic garbage (813 objects over the 1,313 collections of the
        # `philly_noest.csv` week), while each collection scans the ever larger state and log
        # (13% of that week's CPU: 2.3 of 17.7 s). It is left as it was found.
        with gc_paused():
            return self._run(progress)

    def _run(self, progress: Progress | None) -> SimulationResult:
        began = time.perf_counter()
        records = [job.record for job in self._jobs.values()]
        start = min((job.trace.submit_s for job in self._jobs.values()), default=0.0)
        self._setup(start)
        for job in self._jobs.values():
            self._push(job.trace.submit_s, _SUBMIT, job.trace.job_id)
        for stream in self._streams:
            self._next_failure(stream, start)
        now = start
        heap = self._heap
        while heap:
            now = heap[0][0]
            changed = False
            while heap and heap[0][0] == now:
                _, kind, seq, job_id, token = heapq.heappop(heap)
                if kind in (_FAILURE, _REPAIR):
                    changed |= self._hardware(kind, seq, job_id, token, now)
                else:
                    changed |= self._handle(kind, job_id, token, now)
            if changed:
                if self._joined:
                    self._srtf_preempt(now)
                self._cycle(now)
            if not self._timeline or self._timeline[-1][1] != as_number(self._allocated):
                self._timeline.append((now, as_number(self._allocated)))
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
            lost_gpu_s_failures=self._rework_gpu_s + self._checkpoint_gpu_s,
            failure_rework_gpu_s=self._rework_gpu_s,
            checkpoint_write_gpu_s=self._checkpoint_gpu_s,
            node_failures=self._node_failures,
            gpu_failures=self._gpu_failures,
        )

    def _setup(self, at: float) -> None:
        for node in self._nodes:
            self._record(node, at)
        tenants = sorted({job.trace.tenant for job in self._jobs.values()})
        # The core's own fifo (SchedulingPolicy(name="fifo"), not the simulator's fifo
        # baseline, which honours quotas) ignores quotas, so under it the teams carry none: a
        # guarantee no such cycle can honour would only make the auditor flag invariant 4 for
        # a policy that never promised it.
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

    def _order_facts(self, job_id: str) -> OrderFacts:
        job = self._jobs[job_id]
        return OrderFacts(job.trace.submit_s, job.trace.duration_s, job.remaining_s)

    # Failure injection.

    def _next_failure(self, stream: FailureStream, now: float) -> None:
        failure = stream.next_after(now)
        if failure is None:
            return
        gpu = _WHOLE_NODE if failure.gpu_index is None else failure.gpu_index
        self._push(failure.at, _FAILURE, failure.node_id, gpu)
        self._stream_of[self._seq] = stream

    def _hardware(self, kind: int, seq: int, node_id: str, gpu: int, now: float) -> bool:
        """A failure or a repair; True when it changed what the core knows."""
        if kind == _REPAIR:
            if gpu == _WHOLE_NODE:
                self._down_nodes.discard(node_id)
                self._record(NodeRecovered(node_id=node_id), now)
            else:
                self._down_gpus.discard((node_id, gpu))
                self._record(GpuRecovered(node_id=node_id, gpu_index=gpu), now)
            return True
        stream = self._stream_of.pop(seq)
        if self._finished < len(self._jobs):
            # The streams run while work remains; after that nothing is left to disturb.
            self._next_failure(stream, now)
        failures = self._config.failures
        if node_id in self._down_nodes or (node_id, gpu) in self._down_gpus:
            return False  # what is down cannot fail again
        if gpu == _WHOLE_NODE:
            self._down_nodes.add(node_id)
            self._node_failures += 1
            self._record(NodeLost(node_id=node_id, reason="injected node failure"), now)
            self._push(now + failures.node_repair_s, _REPAIR, node_id, _WHOLE_NODE)
        else:
            self._down_gpus.add((node_id, gpu))
            self._gpu_failures += 1
            self._record(
                GpuUnhealthy(node_id=node_id, gpu_index=gpu, reason="injected Xid fault"), now
            )
            self._push(now + failures.gpu_repair_s, _REPAIR, node_id, gpu)
        return True

    # The srtf oracle's evictions, decided before the cycle that may start the shorter work.

    def _srtf_preempt(self, now: float) -> None:
        groups, self._joined = self._joined, set()
        by_quota = self._quotas is not None
        members: dict[str, list[Candidate]] = {group: [] for group in groups}
        for ids, running in ((self._waiting, False), (self._running, True)):
            for job_id in ids:
                job = self._jobs[job_id]
                group = job.trace.tenant if by_quota else ""
                found = members.get(group)
                if found is None:
                    continue
                remaining = job.remaining_s
                if running and job.running_since is not None:
                    remaining -= self._progress(job, now - job.running_since)[0]
                found.append(
                    Candidate(job_id, remaining, job.trace.num_gpus, running, job.trace.submit_s)
                )
        grace = self._policy.preemption_grace_s
        for group in sorted(groups):
            victims, preemptor = srtf_preemptions(members[group], self._group_capacity(group))
            for victim in victims:
                job = self._jobs[victim]
                self._record(
                    PreemptionRequested(
                        job_id=victim,
                        attempt=job.attempt,
                        preemptor_job_id=preemptor,
                        reason="srtf-oracle: shorter remaining work waits",
                        grace_s=grace,
                    ),
                    now,
                )

    def _group_capacity(self, group: str) -> int:
        if self._quotas is None:
            return self._capacity
        quota = self._quotas.get(group)
        ceiling = quota.max_gpus if quota is not None else None
        return self._capacity if ceiling is None else min(ceiling, self._capacity)

    def _handle(self, kind: int, job_id: str, token: int, now: float) -> bool:
        """Apply one due heap entry; True when it changed what the core knows."""
        if kind == _WAKE:
            if token:
                # The wake-up of a cycle: only the last cycle's counts.
                if token != self._cycle_wake_token:
                    return False
                self._cycle_wake = None
                return True
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
        elif self._srtf:
            self._wait(job)
        return True

    def _wait(self, job: _Job) -> None:
        self._waiting[job.trace.job_id] = None
        self._joined.add(job.trace.tenant if self._quotas is not None else "")

    def _admit(self, trace: TraceJob) -> JobAdmitted | JobRejected:
        """The admission service's pure rules' verdict."""
        verdict = admit(trace.job_id, trace.spec, self._catalog, self._classes)
        if isinstance(verdict, JobRejected):
            self._jobs[trace.job_id].record.outcome = "rejected"
        return verdict

    def _cycle(self, now: float) -> None:
        # A flood past the cycle's bound on newly queued jobs is considered over the next
        # cycles, run at once (as the service does), at the same moment.
        while self._one_cycle(now):
            pass

    def _one_cycle(self, now: float) -> bool:
        """One cycle; whether another should follow at once (jobs were left unconsidered)."""
        self._cycles += 1
        # The collector is paused around the whole loop (`run`): its scans of the large state
        # mid-cycle would cost more than the cycle.
        result = self._planner.schedule(self._state, now)
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
        # That answer is about the state as this cycle left it, so it replaces what an earlier
        # cycle asked for: a cycle since then has seen everything that one saw, and more.
        # (Kept, every cycle's wake-up piled up: a gang past its estimate asks for a cycle
        # `overrun_grace_s` on, and every event's cycle started one more such chain, so quiet
        # cycles came to outnumber the events many times over.)
        wakeup = result.next_wakeup
        if wakeup is not None and not now < wakeup < float("inf"):
            wakeup = None
        if wakeup != self._cycle_wake:
            self._cycle_wake = wakeup
            self._cycle_wake_token += 1
            if wakeup is not None:
                self._push(wakeup, _WAKE, "", self._cycle_wake_token)
        return bool(result.not_considered and result.decisions)

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
                # Exact: a slice or share counts its part of a GPU (core/live_sharing.py).
                gpus = sum((placement_gpus(rank) for rank in event.ranks), 0)
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
        job.interval_s, job.checkpoint_cost_s = self._checkpointing(reserved)
        job.ends_at = now + self._run_time(job, job.remaining_s)
        job.ranks_running = True
        job.record.attempts += 1
        if self._srtf:
            self._waiting.pop(reserved.job_id, None)
            self._running[reserved.job_id] = None
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
        self._push(job.ends_at, _EXIT, reserved.job_id, job.token)

    def _checkpointing(self, reserved: GangReserved) -> tuple[float, float]:
        """The attempt's periodic checkpoint interval and what each checkpoint costs it."""
        config = self._config
        failures = config.failures
        interval = config.checkpoint_interval_s
        if interval == AUTO:
            nodes = len({rank.node_id for rank in reserved.ranks})
            gpus = sum(len(rank.gpus) for rank in reserved.ranks)
            rate = failures.gang_failure_rate(nodes, gpus)
            interval = young_daly_interval(config.checkpoint_write_s, rate)
        cost = config.checkpoint_write_s if failures.enabled else 0.0
        return float(interval), cost

    def _run_time(self, job: _Job, work_s: float) -> float:
        """Wall time of `work_s` of work with a periodic checkpoint after every interval."""
        return work_s + self._checkpoints_within(job, work_s) * job.checkpoint_cost_s

    @staticmethod
    def _checkpoints_within(job: _Job, work_s: float) -> int:
        if job.checkpoint_cost_s <= 0 or math.isinf(job.interval_s):
            return 0
        # None after the last piece of work: the job ends instead.
        return max(math.ceil(work_s / job.interval_s) - 1, 0)

    def _progress(self, job: _Job, elapsed: float) -> tuple[float, float, float]:
        """(work done, work saved by periodic checkpoints, time spent writing them) after
        `elapsed` seconds of the attempt."""
        interval, cost = job.interval_s, job.checkpoint_cost_s
        if cost <= 0:
            worked = min(elapsed, job.remaining_s)
            saved = (worked // interval) * interval if interval > 0 else 0.0
            return worked, saved, 0.0
        period = interval + cost
        written = math.floor(elapsed / period)
        into = elapsed - written * period
        worked = min(written * interval + min(into, interval), job.remaining_s)
        saved = min(written * interval, worked)
        writing = written * cost + max(into - interval, 0.0)
        return worked, saved, writing

    def _preempt(self, request: PreemptionRequested, now: float) -> None:
        job = self._jobs[request.job_id]
        if job.running_since is None or request.attempt != job.attempt:
            return
        job.record.preemptions += 1
        self._running.pop(request.job_id, None)
        ends_at = job.ends_at
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
        worked, saved, writing = self._progress(job, stopped - job.running_since)
        if job.work_done:
            worked = saved = job.remaining_s
            writing = self._checkpoints_within(job, job.remaining_s) * job.checkpoint_cost_s
        elif job.checkpoint_ready_at is not None and now >= job.checkpoint_ready_at:
            saved = worked
        # Work since the checkpoint must be redone; time spent writing the checkpoint asked
        # for on preemption is overhead, not lost work. Periodic checkpoints (a cost only
        # with failures injected) are the price of protection against failures.
        gpus = job.trace.num_gpus
        lost = gpus * (worked - saved)
        if event.code in _FAILURE_CODES:
            self._rework_gpu_s += lost
            # The gang can restart at once elsewhere: a cycle right after this one places it
            # (a preempted gang instead waits, as before, for the next event).
            self._wake(now)
        else:
            self._lost_gpu_s += lost
        self._checkpoint_gpu_s += gpus * writing
        job.remaining_s -= saved
        job.running_since = None
        job.stopped_at = None
        job.checkpoint_ready_at = None
        job.work_done = False
        job.ranks = []
        job.token += 1  # any exit still in the heap belongs to the released attempt
        if self._srtf:
            self._running.pop(event.job_id, None)
            self._wait(job)

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
        if job.running_since is not None and record.outcome == "succeeded":
            checkpoints = self._checkpoints_within(job, job.remaining_s)
            self._checkpoint_gpu_s += job.trace.num_gpus * checkpoints * job.checkpoint_cost_s
        job.running_since = None
        job.token += 1
        self._finished += 1
        if self._srtf:
            self._waiting.pop(event.job_id, None)
            self._running.pop(event.job_id, None)


def _record(job: TraceJob) -> SimJobMetrics:
    return SimJobMetrics(
        job_id=job.job_id,
        tenant=job.tenant,
        priority=job.priority,
        num_gpus=job.num_gpus,
        submit_s=job.submit_s,
    )


def _seconds(moment: datetime) -> float:
    return moment.timestamp()
