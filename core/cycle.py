"""One scheduling cycle: `schedule(state, now)` returns decisions and leaves the state alone.

The phases, in order (as in Kueue's scheduler):

1. reactions — outcomes of what happened: exits, cancels, suspends, lost nodes, drains,
   preemption deadlines, max runtime;
2. snapshot  — free GPUs after those releases, with topology aggregates (kept between
   cycles; the cycle's changes to it are undone when it ends);
3. order     — waiting jobs by class, fair share and age (aging first), or arrival for fifo;
4. place     — each job in order: quota, then a topology-fit placement committed whole;
5. backfill  — the first job that cannot start becomes the head: a reservation on concrete
               nodes is planned and later jobs may only start where they do not delay it;
6. preempt   — checkpoint-then-evict whole gangs for jobs entitled to them;
7. explain   — a reason (and estimated start) for every job still waiting, recorded on change.

The caller records `decisions` in order and folds each back with `state.apply(event, now)`:
releases come before the bindings that reuse their GPUs.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass, field
from datetime import UTC, datetime

from core.ordering import fair_share, fifo_key, gangway_key, is_aged
from core.placement import (
    Allocation,
    Shape,
    Snapshot,
    find_placement,
    free_snapshot,
)
from core.policy import PriorityClass, SchedulingPolicy
from core.preemption import VictimPool, plan_preemption
from core.quota import QuotaBook
from core.reservation import estimated_end, plan_reservation
from core.shape import describe_need
from core.state import (
    RESERVED_HEAD,
    JobRecord,
    SchedulerState,
    bits,
)
from schemas.base import Event
from schemas.jobs import (
    HOLDING_STATES,
    TERMINAL_STATES,
    GangReserved,
    JobCancelled,
    JobDeferred,
    JobFailed,
    JobRequeued,
    JobResumed,
    JobSucceeded,
    JobSuspended,
    PreemptionRequested,
    RankPlacement,
    ReservationPlanned,
)
from schemas.nodes import NodeDrained

MAX_PREEMPTORS_PER_CYCLE = 8
_NO_CAPACITY = "waiting for enough free GPUs in one placement"
# The reasons of jobs waiting behind the head name no job: a new head would otherwise record a
# new reason for every job in the queue (the head's own reason names its planned start).
_BEHIND_FIFO = "waiting behind the first job in line (fifo)"
_BEHIND_NO_BACKFILL = "waiting behind the first job in line (backfill is off)"
_BACKFILL_BLOCKED = (
    "free GPUs are held for the reservation of the first job in line, "
    "and this job would not end before it starts"
)
# Reasons that stay true while no GPU at all is free (a quota or shape reason may not).
_STILL_TRUE_WHEN_FULL = frozenset({"no_capacity", "backfill_blocked", "preempting"})
MAX_PREEMPTION_ATTEMPTS = 16


@dataclass(slots=True)
class CycleResult:
    """The decisions of one cycle, plus figures for metrics and benchmarks."""

    decisions: list[Event] = field(default_factory=list)
    gangs_placed: int = 0
    tasks_placed: int = 0
    preemptions: int = 0
    considered: int = 0
    skipped: bool = False
    # The earliest time at which a cycle without new events could decide something new.
    next_wakeup: float | None = None
    head_job_id: str | None = None


@dataclass(slots=True)
class _Outcome:
    """Why a waiting job stays waiting this cycle (typed, as Kubernetes' framework statuses)."""

    code: str
    message: str
    estimated_start: float | None = None


def schedule(state: SchedulerState, now: float) -> CycleResult:
    """Decide what to do at `now`. Pure with respect to the state's contents.

    A cycle whose state has not changed since a cycle that decided nothing, before that cycle's
    next time-driven wake-up, is answered at once: that memo is the only thing written.
    """
    memo = state.quiet_memo
    if memo is not None and memo[0] == state.generation and now < memo[1]:
        return CycleResult(skipped=True, next_wakeup=memo[1])
    # A cycle allocates many short-lived objects and no reference cycles; letting the cyclic
    # collector scan a heap of 100,000 GPUs' state mid-cycle would cost more than the cycle.
    collecting = gc.isenabled()
    gc.disable()
    try:
        result = _Cycle(state, now).run()
    finally:
        if collecting:
            gc.enable()
    if not result.decisions:
        wakeup = result.next_wakeup if result.next_wakeup is not None else float("inf")
        state.quiet_memo = (state.generation, wakeup)
    return result


def _when(ts: float) -> str:
    moment = datetime.fromtimestamp(ts, UTC)
    return moment.strftime("%Y-%m-%d %H:%M UTC")


def _racks_of(state: SchedulerState, node_ids: list[str], limit: int = 4) -> str:
    racks: list[str] = []
    for node_id in node_ids:
        node = state._nodes.get(node_id)
        if node is not None and node.rack not in racks:
            racks.append(node.rack)
    shown = ", ".join(racks[:limit])
    more = f" and {len(racks) - limit} more" if len(racks) > limit else ""
    label = "rack" if len(racks) == 1 else "racks"
    return f"{label} {shown}{more}"


class _Cycle:
    def __init__(self, state: SchedulerState, now: float) -> None:
        self.state = state
        self.policy: SchedulingPolicy = state.policy
        self.now = now
        self.result = CycleResult()
        self.decisions = self.result.decisions
        self.released: set[str] = set()
        self.handled: set[str] = set()
        self.outcomes: dict[str, _Outcome] = {}
        self.wakeups: list[float] = []
        self.infeasibility: dict[Shape, str | None] = {}
        # Gangs bound in this cycle, (estimated end, ranks), for the head's reservation.
        self.placed_gangs: list[tuple[float, list[tuple[int, int]]]] = []

    def run(self) -> CycleResult:
        self.react()
        with free_snapshot(self.state) as snap:
            self.release_into(snap)
            quota = QuotaBook(self.state._queues)
            for job_id in self.released:
                job = self.state._jobs[job_id]
                quota.charge(job.queue, -job.bound_gpus)
            waiting = self.order(quota)
            blocked = self.place(snap, waiting, quota)
            if self.policy.preemption and not self.policy.is_fifo:
                self.preempt(snap, blocked, quota)
        self.explain(waiting)
        # A moment already reached was acted on (or needs nothing) in this very cycle.
        future = [moment for moment in self.wakeups if moment > self.now]
        self.result.next_wakeup = min(future) if future else None
        return self.result

    # ------------------------------------------------------------ 1. reactions

    def emit(self, event: Event) -> None:
        self.decisions.append(event)

    def release(self, job: JobRecord, event: Event) -> None:
        self.emit(event)
        self.released.add(job.job_id)
        self.handled.add(job.job_id)

    def react(self) -> None:
        """Cancels first, then gang outcomes, then suspends and resumes.

        Hardware and request checks run only for jobs the state flagged for attention; every
        holding gang is visited for its deadlines, which is cheap.
        """
        state = self.state
        flagged = sorted(state._attention)
        for job_id in flagged:
            job = state._jobs.get(job_id)
            if job is not None and job.cancel_requested and job.state not in TERMINAL_STATES:
                self.release(
                    job,
                    JobCancelled(
                        job_id=job.job_id,
                        attempt=job.attempt or None,
                        reason="cancelled by request",
                    ),
                )
        attention = set(flagged)
        for job in list(state._holding.values()):
            if job.job_id not in self.handled:
                self.react_to_gang(job, job.job_id in attention)
        for job_id in flagged:
            job = state._jobs.get(job_id)
            if job is not None and job.job_id not in self.handled:
                self.react_to_requests(job)
        self.react_to_drains()

    def react_to_requests(self, job: JobRecord) -> None:
        if job.state in TERMINAL_STATES:
            return
        if job.suspend_requested and job.state != "suspended":
            attempt = job.attempt if job.state in HOLDING_STATES else None
            self.release(job, JobSuspended(job_id=job.job_id, attempt=attempt))
        elif job.resume_requested and job.state == "suspended":
            self.emit(JobResumed(job_id=job.job_id))
            self.handled.add(job.job_id)

    def react_to_gang(self, job: JobRecord, flagged: bool) -> None:
        """Outcomes of a bound gang: exits, lost hardware, drains, deadlines."""
        now, policy = self.now, self.policy
        spec = job.spec
        codes = job.exit_codes
        if not flagged and not codes and job.state != "preempting":
            # Most gangs in most cycles: nothing happened to them, only the clock moved.
            if not self.past_max_runtime(job):
                self.note_estimated_end(job)
            return
        ranks = len(job.ranks)
        failed = [rank for rank, code in sorted(codes.items()) if code != 0]
        if job.state == "preempting":
            deadline = (job.preempt_requested_at or now) + job.preempt_grace_s
            drained = job.preemptor_id is None
            code = "node_drained" if drained else "preempted"
            # Every rank exiting 0 of its own accord (not stopped for the eviction) means the
            # gang finished its work before the checkpoint was needed: requeueing it would run
            # a finished job again. Any rank evicted or failing means the gang stopped short:
            # it resumes from its checkpoint.
            finished = (
                ranks > 0
                and len(codes) == ranks
                and not job.evicted_ranks
                and not any(codes.values())
            )
            if finished:
                self.release(job, JobSucceeded(job_id=job.job_id, attempt=job.attempt))
                return
            if len(codes) == ranks or now >= deadline:
                why = (
                    "checkpointed off a draining node"
                    if drained
                    else f"preempted for job {job.preemptor_id}"
                )
                self.release(
                    job, JobRequeued(job_id=job.job_id, attempt=job.attempt, code=code, reason=why)
                )
            else:
                self.wakeups.append(deadline)
            return
        if failed:
            rank = failed[0]
            retries = spec.max_retries if spec is not None else 0
            if job.failures + 1 <= retries:
                self.release(
                    job,
                    JobRequeued(
                        job_id=job.job_id,
                        attempt=job.attempt,
                        code="task_failed",
                        reason=f"rank {rank} exited with code {codes[rank]}; "
                        f"retry {job.failures + 1} of {retries}",
                    ),
                )
            else:
                self.release(
                    job,
                    JobFailed(
                        job_id=job.job_id,
                        attempt=job.attempt,
                        reason=f"rank {rank} exited with code {codes[rank]}; "
                        f"no retries left (max_retries={retries})",
                    ),
                )
            return
        if ranks and len(codes) == ranks:
            self.release(job, JobSucceeded(job_id=job.job_id, attempt=job.attempt))
            return
        lost = self.lost_hardware(job) if flagged else None
        if lost is not None:
            code, why = lost
            self.release(
                job, JobRequeued(job_id=job.job_id, attempt=job.attempt, code=code, reason=why)
            )
            return
        if self.past_max_runtime(job):
            return
        draining = self.draining_node_of(job) if flagged else None
        if draining is not None:
            self.emit(
                PreemptionRequested(
                    job_id=job.job_id,
                    attempt=job.attempt,
                    preemptor_job_id=None,
                    reason=f"node {draining} is draining: checkpoint and move",
                    grace_s=policy.preemption_grace_s,
                )
            )
            self.handled.add(job.job_id)
            return
        self.note_estimated_end(job)

    def past_max_runtime(self, job: JobRecord) -> bool:
        """Fail a gang past its max runtime (True); else note when that limit comes."""
        spec = job.spec
        if spec is not None and spec.max_runtime_s is not None and job.started_at is not None:
            limit = job.started_at + spec.max_runtime_s
            if self.now > limit:
                self.release(
                    job,
                    JobFailed(
                        job_id=job.job_id, attempt=job.attempt, reason="exceeded max_runtime_s"
                    ),
                )
                return True
            self.wakeups.append(limit)
        return False

    def note_estimated_end(self, job: JobRecord) -> None:
        """With backfill, a gang's expected end is when the head's reservation may move."""
        if self.policy.backfill:
            self.wakeups.append(estimated_end(job, self.now, self.policy))

    def lost_hardware(self, job: JobRecord) -> tuple[str, str] | None:
        nodes = self.state._node_list
        for node_index, mask in job.ranks:
            node = nodes[node_index]
            if node.lost:
                return "node_lost", f"node {node.node_id} was lost; the gang restarts whole"
            bad = mask & node.unhealthy_mask
            if bad:
                return "gpu_unhealthy", (
                    f"GPU {bits(bad)[0]} of node {node.node_id} became unhealthy; "
                    "the gang restarts whole"
                )
        return None

    def draining_node_of(self, job: JobRecord) -> str | None:
        nodes = self.state._node_list
        for node_index, _ in job.ranks:
            if nodes[node_index].draining:
                return nodes[node_index].node_id
        return None

    def react_to_drains(self) -> None:
        state = self.state
        for index in sorted(state._draining):
            node = state._node_list[index]
            if not node.draining:
                continue
            if all(job_id in self.released for job_id in node.gangs):
                self.emit(NodeDrained(node_id=node.node_id))

    # ------------------------------------------------------------ 2. snapshot

    def release_into(self, snap: Snapshot) -> None:
        """Give the snapshot the GPUs of the gangs this cycle released."""
        state = self.state
        for job_id in sorted(self.released):
            job = state._jobs[job_id]
            for node_index, mask in job.ranks:
                snap.release(node_index, mask)

    # ------------------------------------------------------------ 3. order

    def order(self, quota: QuotaBook) -> list[JobRecord]:
        state, policy, now = self.state, self.policy, self.now
        candidates = [job for job in state._waiting.values() if job.job_id not in self.handled]
        self.result.considered = len(candidates)
        if policy.is_fifo:
            candidates.sort(key=fifo_key)
            return candidates
        shares: dict[str, float] = {}
        keyed = []
        for job in candidates:
            share = shares.get(job.queue)
            if share is None:
                share = fair_share(state._queues.get(job.queue), now, policy)
                shares[job.queue] = share
            rank = policy.priority_class(job.priority).rank
            aged = is_aged(job, now, policy)
            if not aged and job.queued_at is not None:
                self.wakeups.append(job.queued_at + policy.aging_max_wait_s)
            shape = job.shape
            within = shape is not None and quota.within_guarantee(job.queue, shape.min_gpus)
            key = gangway_key(job, rank, share, aged, self.victims_released(job), within)
            keyed.append((key, job))
        keyed.sort(key=lambda pair: pair[0])
        return [job for _, job in keyed]

    def victims_released(self, job: JobRecord) -> bool:
        if not job.awaiting_victims:
            return False
        return not self.victims_pending(job)

    def victims_pending(self, job: JobRecord) -> list[str]:
        """The job's victims still being evicted: their GPUs are about to come free.

        Only a gang still under eviction counts. A victim that was requeued and then bound a
        new gang (a backfill, even onto the very GPUs it gave up) releases nothing for this
        job: counting it kept the preemptor waiting "for its victims", and out of the
        preemption phase, until that new gang ended on its own (invariant 4).
        """
        jobs = self.state._jobs
        return [
            victim
            for victim in job.awaiting_victims
            if victim not in self.released
            and (record := jobs.get(victim)) is not None
            and record.state == "preempting"
        ]

    # ------------------------------------------------------------ 4-5. place and backfill

    def shape(self, job: JobRecord) -> Shape | None:
        return job.shape

    def place(self, snap: Snapshot, waiting: list[JobRecord], quota: QuotaBook) -> list[JobRecord]:
        """Place jobs in order; return those that wait for capacity (preemption may help them)."""
        policy, now, outcomes = self.policy, self.now, self.outcomes
        fifo = policy.is_fifo
        enforce = policy.enforce_quotas and not fifo
        failed: dict[tuple[str | None, int, str, bool], int] = {}
        fits_unreserved: dict[Shape, tuple[int, bool]] = {}
        blocked: list[JobRecord] = []
        head: JobRecord | None = None
        head_start: float | None = None
        budget = policy.max_placements_per_cycle
        for job in waiting:
            shape = job.shape
            if shape is None:
                continue
            if (
                snap.total_free == 0
                and head is not None
                and not job.awaiting_victims
                and job.reason_code in _STILL_TRUE_WHEN_FULL
            ):
                # Nothing is free: the job's recorded reason still holds; skip the work.
                blocked.append(job)
                continue
            if job.awaiting_victims:
                pending_victims = self.victims_pending(job)
                if pending_victims:
                    count = len(pending_victims)
                    outcomes[job.job_id] = _Outcome(
                        "awaiting_preemption",
                        f"{job.need}; waiting for {count} preempted "
                        f"gang{'s' if count != 1 else ''} to release their GPUs",
                    )
                    continue
            if fifo and head is not None:
                outcomes[job.job_id] = _Outcome("head_of_line", _BEHIND_FIFO)
                continue
            if enforce:
                hit = quota.ceiling_hit(job.queue, shape.min_gpus)
                if hit is not None:
                    name, ceiling = hit
                    outcomes[job.job_id] = _Outcome(
                        "quota_ceiling",
                        f"{job.need}; queue {name} would exceed its ceiling of {ceiling} GPUs",
                    )
                    continue
            if head is not None and not policy.backfill:
                outcomes[job.job_id] = _Outcome("behind_head", f"{job.need}; {_BEHIND_NO_BACKFILL}")
                continue
            infeasible = self.infeasible(shape)
            if infeasible is not None:
                outcomes[job.job_id] = _Outcome("unsatisfiable", infeasible)
                continue
            if budget <= 0:
                outcomes[job.job_id] = _Outcome(
                    "cycle_budget", f"{job.need}; placement deferred to the next cycle"
                )
                continue
            avoid = head is not None and not (
                head_start is not None and now + self.estimate(job) <= head_start
            )
            allocation = self.try_place(snap, shape, avoid, failed)
            if allocation is not None:
                self.bind(snap, job, shape, allocation, quota)
                budget -= 1
                continue
            blocked.append(job)
            if head is None and self.may_be_head(job):
                head = job
                self.result.head_job_id = job.job_id
                if fifo or not policy.backfill:
                    outcomes[job.job_id] = _Outcome("no_capacity", f"{job.need}; {_NO_CAPACITY}")
                    continue
                head_start = self.reserve(snap, job, shape)
                failed = {key: k for key, k in failed.items() if not key[3]}
                continue
            if (
                avoid
                and head is not None
                and self.fits_unreserved(snap, shape, failed, fits_unreserved)
            ):
                outcomes[job.job_id] = _Outcome(
                    "backfill_blocked", f"{job.need}; {_BACKFILL_BLOCKED}"
                )
            else:
                outcomes[job.job_id] = _Outcome("no_capacity", f"{job.need}; {_NO_CAPACITY}")
        return blocked

    def may_be_head(self, job: JobRecord) -> bool:
        """Best-effort work runs on idle capacity only; it never holds a reservation."""
        return self.policy.is_fifo or job.priority != self.policy.idle_only_priority

    def estimate(self, job: JobRecord) -> float:
        spec = job.spec
        if spec is not None and spec.estimated_runtime_s is not None:
            return spec.estimated_runtime_s
        if spec is not None and spec.max_runtime_s is not None:
            return spec.max_runtime_s
        return self.policy.default_runtime_estimate_s

    def try_place(
        self,
        snap: Snapshot,
        shape: Shape,
        avoid: bool,
        failed: dict[tuple[str | None, int, str, bool], int],
    ) -> Allocation | None:
        # Capacity only shrinks while placing, so a shape that failed makes larger ones fail too.
        key = shape.failure_key(avoid)
        smallest_failure = failed.get(key)
        if smallest_failure is not None and shape.min_units >= smallest_failure:
            return None
        if snap.total_free < shape.min_gpus:
            return None
        allocation = find_placement(snap, shape, avoid)
        if allocation is None:
            failed[key] = min(shape.min_units, smallest_failure or shape.min_units)
        return allocation

    def fits_unreserved(
        self,
        snap: Snapshot,
        shape: Shape,
        failed: dict[tuple[str | None, int, str, bool], int],
        known: dict[Shape, tuple[int, bool]],
    ) -> bool:
        """Whether the gang would fit but for the head's reservation.

        Thousands of waiting jobs of a few shapes ask this in one cycle; the answer for a shape
        holds until the snapshot changes.
        """
        seen = known.get(shape)
        if seen is not None and seen[0] == snap.changes:
            return seen[1]
        fits = self.try_place(snap, shape, False, failed) is not None
        known[shape] = (snap.changes, fits)
        return fits

    def infeasible(self, shape: Shape) -> str | None:
        """Why the gang could never fit this cluster as it is (empty), or None."""
        if shape in self.infeasibility:
            return self.infeasibility[shape]
        why = self._infeasible(shape)
        self.infeasibility[shape] = why
        return why

    def _infeasible(self, shape: Shape) -> str | None:
        biggest, pools = self.state.capacity_profile()
        if shape.gpu_type is not None and shape.gpu_type not in pools:
            return f"{describe_need(shape)}; the cluster has no schedulable {shape.gpu_type} GPUs"
        usable = [shape.gpu_type] if shape.gpu_type is not None else list(pools)
        largest = max((biggest.get(pool, 0) for pool in usable), default=0)
        if shape.unit_gpus > largest:
            return (
                f"{describe_need(shape)}; no schedulable node has {shape.unit_gpus} healthy "
                f"GPUs (largest has {largest})"
            )
        if shape.require == "node" and shape.min_gpus > largest:
            return (
                f"{describe_need(shape)}; no schedulable node has that many (largest has {largest})"
            )
        capacity = max((pools.get(pool, 0) for pool in usable), default=0)
        if shape.min_gpus > capacity:
            return (
                f"{describe_need(shape)}; the cluster has only {capacity} schedulable GPUs"
                " of that kind"
            )
        return None

    def bind(
        self,
        snap: Snapshot,
        job: JobRecord,
        shape: Shape,
        allocation: Allocation,
        quota: QuotaBook,
    ) -> None:
        ranks = snap.commit(shape, allocation)
        self.placed_gangs.append((self.now + self.estimate(job), ranks))
        nodes = self.state._node_list
        self.emit(
            # Built without re-validation: the core constructs these from checked state, and a
            # cycle binding thousands of ranks would otherwise spend its time in validators.
            GangReserved.model_construct(
                job_id=job.job_id,
                attempt=job.attempt + 1,
                ranks=[
                    RankPlacement.model_construct(
                        rank=rank, node_id=nodes[index].node_id, gpus=bits(mask)
                    )
                    for rank, (index, mask) in enumerate(ranks)
                ],
            )
        )
        quota.charge(job.queue, sum(mask.bit_count() for _, mask in ranks))
        self.result.gangs_placed += 1
        self.result.tasks_placed += len(ranks)

    def reserve(self, snap: Snapshot, job: JobRecord, shape: Shape) -> float | None:
        """Plan the head's earliest start on concrete nodes; pin them against backfill."""
        state, now, policy = self.state, self.now, self.policy
        planned = plan_reservation(
            snap, shape, state, self.released, now, policy, self.placed_gangs
        )
        if planned is None:
            self.outcomes[job.job_id] = _Outcome(
                "no_capacity",
                f"{job.need}; it does not fit even when the running gangs end",
            )
            return None
        start, allocation = planned
        snap.reserved = frozenset(index for index, _ in allocation)
        node_ids = sorted(state._node_list[index].node_id for index, _ in allocation)
        where = _racks_of(state, node_ids)
        self.outcomes[job.job_id] = _Outcome(
            RESERVED_HEAD,
            f"{job.need}; earliest at {_when(start)} on {where}",
            estimated_start=start,
        )
        previous = job.estimated_start
        moved = (
            previous is None
            or abs(previous - start) > policy.reservation_move_threshold_s
            or _racks_of(state, list(job.reserved_nodes)) != where
        )
        if moved:
            self.emit(
                ReservationPlanned(
                    job_id=job.job_id, start_at=datetime.fromtimestamp(start, UTC), nodes=node_ids
                )
            )
        self.wakeups.append(start)
        return start

    # ------------------------------------------------------------ 6. preempt

    def preempt(self, snap: Snapshot, blocked: list[JobRecord], quota: QuotaBook) -> None:
        policy, now = self.policy, self.now
        taken: set[str] = set()
        preemptors = 0
        attempts = 0
        pool: VictimPool | None = None
        credited = False
        # Victims only get scarcer within a cycle: a shape that found none makes larger fail.
        failed: dict[tuple[object, ...], int] = {}
        for job in blocked:
            if preemptors >= MAX_PREEMPTORS_PER_CYCLE or attempts >= MAX_PREEMPTION_ATTEMPTS:
                break
            shape = self.shape(job)
            if shape is None or (job.awaiting_victims and self.victims_pending(job)):
                continue
            if job.last_preempting_at is not None:
                calm_until = job.last_preempting_at + policy.hysteresis_s
                if now < calm_until:
                    self.wakeups.append(calm_until)
                    continue
            if not credited:
                self.credit_leaving(quota)
                credited = True
            pclass = policy.priority_class(job.priority)
            reclaiming = quota.within_guarantee(job.queue, shape.min_gpus)
            overrun_head = (
                job.job_id == self.result.head_job_id
                and job.estimated_start is not None
                and job.estimated_start <= now
            )
            if not (pclass.can_preempt or reclaiming or overrun_head):
                continue
            if job.priority == policy.idle_only_priority:
                continue
            key = (
                pclass.rank,
                reclaiming,
                job.queue if reclaiming else "",
                overrun_head,
                *shape.failure_key(False),
            )
            if key in failed and shape.min_units >= failed[key]:
                continue
            if pool is None:
                pool = VictimPool(self.state, now, policy, self.wakeups)
            if not pool.entries:
                break
            attempts += 1
            plan = plan_preemption(
                snap,
                shape,
                job,
                pclass,
                reclaiming,
                overrun_head,
                self.state,
                quota,
                self.released | taken,
                now,
                policy,
                pool,
            )
            if plan is None:
                failed[key] = min(failed.get(key, shape.min_units), shape.min_units)
                continue
            preemptors += 1
            names = ", ".join(victim.job_id for victim in plan[:3])
            more = f" and {len(plan) - 3} more" if len(plan) > 3 else ""
            for victim in plan:
                taken.add(victim.job_id)
                quota.charge(victim.queue, -victim.bound_gpus)
                why = (
                    "reclaiming guaranteed capacity"
                    if reclaiming
                    else "its reservation is overdue"
                    if overrun_head and not pclass.can_preempt
                    else f"priority {job.priority}"
                )
                self.emit(
                    PreemptionRequested(
                        job_id=victim.job_id,
                        attempt=victim.attempt,
                        preemptor_job_id=job.job_id,
                        reason=f"preempted for job {job.job_id} ({why})",
                        grace_s=policy.preemption_grace_s,
                    )
                )
                self.result.preemptions += 1
            self.outcomes[job.job_id] = _Outcome(
                "preempting",
                f"{job.need}; preempting {names}{more}; starts once they checkpoint "
                f"(within {policy.preemption_grace_s:g} s)",
            )

    def credit_leaving(self, quota: QuotaBook) -> None:
        """Gangs already under eviction leave soon: their queues are not borrowing them.

        Counting them made each later cycle take another gang of a lender already giving
        back its borrowed GPUs, until it fell below its guarantee (invariant 4).
        """
        for job in self.state._holding.values():
            if job.state == "preempting" and job.job_id not in self.released:
                quota.charge(job.queue, -job.bound_gpus)

    # ------------------------------------------------------------ 7. explain

    def explain(self, waiting: list[JobRecord]) -> None:
        for job in waiting:
            outcome = self.outcomes.get(job.job_id)
            if outcome is None:
                continue
            if job.reason_code != outcome.code or job.reason != outcome.message:
                self.emit(
                    JobDeferred.model_construct(
                        job_id=job.job_id, code=outcome.code, message=outcome.message
                    )
                )


def class_of(policy: SchedulingPolicy, job: JobRecord) -> PriorityClass:
    return policy.priority_class(job.priority)
