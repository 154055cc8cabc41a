"""Phase 1 of the cycle, reactions: the outcomes of what happened since the last cycle.

Cancels first, then gang outcomes (exits, lost hardware, drains, preemption deadlines, max
runtime, launch timeouts), then suspends and resumes, then drained nodes. Hardware and request
checks run only for jobs the state flagged for attention. With a planner's timers
(core/timers.py) only the holding gangs flagged, being preempted or at a deadline are visited,
and the wake-ups of the others come summed up as one moment; without them every holding gang
is visited, with the same decisions and the same earliest wake-up.
"""

from __future__ import annotations

from core.context import CycleContext
from core.reservation import estimated_end
from core.retry import FREE_AGENT_RESTARTS
from core.state import CoreJob, bits
from core.timers import GangTimers
from schemas.jobs import (
    HOLDING_STATES,
    TERMINAL_STATES,
    JobCancelled,
    JobFailed,
    JobRequeued,
    JobResumed,
    JobSucceeded,
    JobSuspended,
    PreemptionRequested,
)
from schemas.nodes import NodeDrained
from schemas.reasons import LAUNCH_TIMEOUT, LAUNCH_UNHEARD, NODE_LOST, TASK_FAILED, RequeueCode


def react(ctx: CycleContext, timers: GangTimers | None = None) -> None:
    """Record every reaction in the context; the gangs it releases are in `ctx.released`."""
    state = ctx.state
    jobs = state.job_records
    flagged = sorted(state.attention)
    for job_id in flagged:
        job = jobs.get(job_id)
        if job is not None and job.cancel_requested and job.state not in TERMINAL_STATES:
            ctx.release(
                job,
                JobCancelled(
                    job_id=job.job_id,
                    attempt=job.attempt or None,
                    reason="cancelled by request",
                ),
            )
    attention = set(flagged)
    if timers is None:
        gangs = list(state.holding_jobs.values())
    else:
        gangs, wakeup = timers.gangs_to_visit(state, ctx.now, attention)
        if wakeup is not None:
            ctx.wakeups.append(wakeup)
        ctx.held_ends = timers.held_ends()
    for job in gangs:
        if job.job_id not in ctx.handled:
            react_to_gang(ctx, job, job.job_id in attention)
    for job_id in flagged:
        job = jobs.get(job_id)
        if job is not None and job.job_id not in ctx.handled:
            react_to_requests(ctx, job)
    react_to_drains(ctx)


def react_to_requests(ctx: CycleContext, job: CoreJob) -> None:
    if job.state in TERMINAL_STATES:
        return
    if job.suspend_requested and job.state != "suspended":
        if job.state == "preempting":
            return  # the eviction's end suspends it (react_to_eviction), from its checkpoint
        if job.state == "running":
            checkpoint_then_suspend(ctx, job)
            return
        attempt = job.attempt if job.state in HOLDING_STATES else None
        ctx.release(job, JobSuspended(job_id=job.job_id, attempt=attempt))
    elif job.resume_requested and job.state == "suspended":
        ctx.emit(JobResumed(job_id=job.job_id))
        ctx.handled.add(job.job_id)


def checkpoint_then_suspend(ctx: CycleContext, job: CoreJob) -> None:
    """Suspend keeps the work: the gang is checkpointed and stopped as for a preemption
    (its agents write the shards, then stop the ranks), and suspended once it is down."""
    ctx.emit(
        PreemptionRequested(
            job_id=job.job_id,
            attempt=job.attempt,
            preemptor_job_id=None,
            reason="suspended by request: checkpoint, then stop",
            grace_s=ctx.policy.preemption_grace_s,
        )
    )
    ctx.handled.add(job.job_id)


def react_to_gang(ctx: CycleContext, job: CoreJob, flagged: bool) -> None:
    """Outcomes of a bound gang: exits, lost hardware, drains, deadlines."""
    codes = job.exit_codes
    if not flagged and not codes and job.state != "preempting":
        # Most gangs in most cycles: nothing happened to them, only the clock moved.
        if not launch_overdue(ctx, job) and not past_max_runtime(ctx, job):
            note_estimated_end(ctx, job)
        return
    if job.state == "preempting":
        react_to_eviction(ctx, job)
        return
    failed = [rank for rank, code in sorted(codes.items()) if code != 0]
    own = [rank for rank in failed if rank not in job.agent_lost_ranks]
    if own:
        react_to_failure(ctx, job, own[0])
        return
    if failed and job.agent_requeues >= FREE_AGENT_RESTARTS:
        # Lost with their agent once more: past a few such losses, the job's doing or not,
        # each spends a retry (and waits its backoff) as a failure, or it looped for ever.
        react_to_failure(ctx, job, failed[0])
        return
    if failed:
        # Lost when their agent restarted (a crash, a kill): as with a lost node, the gang
        # restarts whole, at once, and the job spends no retry on what it did not do.
        rank = failed[0]
        node = ctx.state.node_records[job.ranks[rank][0]].node_id
        why = f"rank {rank} on {node} was lost when its agent restarted; the gang restarts whole"
        ctx.release(
            job, JobRequeued(job_id=job.job_id, attempt=job.attempt, code=NODE_LOST, reason=why)
        )
        return
    if job.ranks and len(codes) == len(job.ranks):
        ctx.release(job, JobSucceeded(job_id=job.job_id, attempt=job.attempt))
        return
    lost = lost_hardware(ctx, job) if flagged else None
    if lost is not None:
        lost_code, why = lost
        ctx.release(
            job, JobRequeued(job_id=job.job_id, attempt=job.attempt, code=lost_code, reason=why)
        )
        return
    if launch_overdue(ctx, job) or past_max_runtime(ctx, job):
        return
    draining = draining_node_of(ctx, job) if flagged else None
    if draining is not None:
        ctx.emit(
            PreemptionRequested(
                job_id=job.job_id,
                attempt=job.attempt,
                preemptor_job_id=None,
                reason=f"node {draining} is draining: checkpoint and move",
                grace_s=ctx.policy.preemption_grace_s,
            )
        )
        ctx.handled.add(job.job_id)
        return
    note_estimated_end(ctx, job)


def react_to_eviction(ctx: CycleContext, job: CoreJob) -> None:
    """A gang being preempted (or moved off a draining node): requeued once every rank has
    exited or its grace has run out; succeeded if it finished its work first."""
    codes = job.exit_codes
    ranks = len(job.ranks)
    deadline = (job.preempt_requested_at or ctx.now) + job.preempt_grace_s
    drained = job.preemptor_id is None
    code: RequeueCode = "node_drained" if drained else "preempted"
    # Every rank exiting 0 of its own accord (not stopped for the eviction) means the gang
    # finished its work before the checkpoint was needed: requeueing it would run a finished
    # job again. Any rank evicted or failing means the gang stopped short: it resumes from its
    # checkpoint.
    finished = (
        ranks > 0 and len(codes) == ranks and not job.evicted_ranks and not any(codes.values())
    )
    if finished:
        ctx.release(job, JobSucceeded(job_id=job.job_id, attempt=job.attempt))
        return
    down = len(codes) == ranks or ctx.now >= deadline
    over_limit = over_max_runtime(ctx, job)
    if down and over_limit is not None:
        ctx.release(job, JobFailed(job_id=job.job_id, attempt=job.attempt, reason=over_limit))
        return
    if down and job.suspend_requested:
        ctx.release(job, JobSuspended(job_id=job.job_id, attempt=job.attempt))
        return
    if down:
        # Whether a checkpoint was committed is the checkpoint service's verdict, not known
        # here (seen live: an agent killed during the drain's checkpoint, nothing committed,
        # and the requeue said "checkpointed").
        why = "moved off a draining node" if drained else f"preempted for job {job.preemptor_id}"
        ctx.release(job, JobRequeued(job_id=job.job_id, attempt=job.attempt, code=code, reason=why))
    else:
        ctx.wakeups.append(deadline)


def launch_overdue(ctx: CycleContext, job: CoreJob) -> bool:
    """Release a reserved gang whose ranks have not all started within the launch timeout
    (True): an agent that died or a launch nobody reported must not hold GPUs forever."""
    if job.state != "reserved" or job.reserved_at is None:
        return False
    timeout = ctx.policy.launch_timeout_s
    deadline = job.reserved_at + timeout
    if ctx.now < deadline:
        ctx.wakeups.append(deadline)
        return False
    nodes = ctx.state.node_records
    missing = [rank for rank in range(len(job.ranks)) if rank not in job.started_ranks]
    where = sorted({nodes[job.ranks[rank][0]].node_id for rank in missing})
    shown = ", ".join(map(str, missing[:8])) + (" …" if len(missing) > 8 else "")
    what = (
        f"rank{'s' if len(missing) != 1 else ''} {shown} on {', '.join(where[:4])} "
        f"did not start within {timeout:g} s of the reservation"
    )
    if ctx.state.last_rank_started_at < job.reserved_at:
        # No agent started any rank of any gang since this one was reserved: the launch path
        # is down (the bus away: no agent hears a reservation), not this job's launch. Its
        # GPUs are released as usual, but no retry is spent: a broker outage longer than the
        # timeout failed every job reserved meanwhile that had no retry left (as the
        # inventory declares no node lost while it cannot hear the fleet).
        ctx.release(
            job,
            JobRequeued(
                job_id=job.job_id,
                attempt=job.attempt,
                code=LAUNCH_UNHEARD,
                reason=f"{what}, nor did any rank of any gang since: the node agents do not "
                "hear reservations (is the bus down?); not counted as a failure",
            ),
        )
        return True
    requeue_or_fail(ctx, job, LAUNCH_TIMEOUT, what)
    return True


def requeue_or_fail(ctx: CycleContext, job: CoreJob, code: RequeueCode, what: str) -> None:
    """The attempt ended badly: the gang waits again while retries are left, else it fails."""
    retries = job.spec.max_retries if job.spec is not None else 0
    if job.failures + 1 <= retries:
        ctx.release(
            job,
            JobRequeued(
                job_id=job.job_id,
                attempt=job.attempt,
                code=code,
                reason=f"{what}; retry {job.failures + 1} of {retries}",
            ),
        )
    else:
        ctx.release(
            job,
            JobFailed(
                job_id=job.job_id,
                attempt=job.attempt,
                reason=f"{what}; no retries left (max_retries={retries})",
            ),
        )


def react_to_failure(ctx: CycleContext, job: CoreJob, rank: int) -> None:
    """A rank failed: the gang restarts whole while retries are left, unless retrying
    cannot help; else it fails."""
    said = job.exit_reasons.get(rank)
    what = f"rank {rank} exited with code {job.exit_codes[rank]}"
    if said is not None:
        # A rank that never started says so itself ("launch failed on n0001 rank 0: …").
        what = said if said.startswith("launch failed") else f"{what} ({said})"
    if job.permanent_failure:
        reason = (
            f"{what}; not retried: it would fail the same way"
            if job.permanent_reason is None
            else f"{what}; {job.permanent_reason}"
        )
        ctx.release(job, JobFailed(job_id=job.job_id, attempt=job.attempt, reason=reason))
    else:
        requeue_or_fail(ctx, job, TASK_FAILED, what)


def past_max_runtime(ctx: CycleContext, job: CoreJob) -> bool:
    """A gang past its max runtime (True) is checkpointed and stopped, within the grace,
    and then failed (see `over_max_runtime`); else note when that limit comes."""
    spec = job.spec
    if spec is not None and spec.max_runtime_s is not None and job.started_at is not None:
        limit = job.started_at + spec.max_runtime_s
        if ctx.now > limit:
            ctx.emit(
                PreemptionRequested(
                    job_id=job.job_id,
                    attempt=job.attempt,
                    preemptor_job_id=None,
                    reason=f"ran past max_runtime_s ({spec.max_runtime_s:g} s): "
                    "checkpoint, then stop",
                    grace_s=ctx.policy.preemption_grace_s,
                )
            )
            ctx.handled.add(job.job_id)
            return True
        ctx.wakeups.append(limit)
    return False


def over_max_runtime(ctx: CycleContext, job: CoreJob) -> str | None:
    """The reason to fail a gang whose eviction ends past its max runtime, or None."""
    spec = job.spec
    if spec is None or spec.max_runtime_s is None or job.started_at is None:
        return None
    if ctx.now <= job.started_at + spec.max_runtime_s:
        return None
    return f"exceeded max_runtime_s ({spec.max_runtime_s:g} s); stopped after its checkpoint"


def note_estimated_end(ctx: CycleContext, job: CoreJob) -> None:
    """With backfill, a gang's expected end is when the head's reservation may move."""
    if ctx.policy.backfill:
        ctx.wakeups.append(estimated_end(job, ctx.now, ctx.policy, ctx.state.estimates))


def lost_hardware(ctx: CycleContext, job: CoreJob) -> tuple[RequeueCode, str] | None:
    nodes = ctx.state.node_records
    for rank, (node_index, mask) in enumerate(job.ranks):
        node = nodes[node_index]
        # A node lost and back before this cycle took the rank's process with it all the same.
        if node.lost or rank in job.lost_ranks:
            return "node_lost", f"node {node.node_id} was lost; the gang restarts whole"
        bad = mask & node.unhealthy_mask
        if bad:
            return "gpu_unhealthy", (
                f"GPU {bits(bad)[0]} of node {node.node_id} became unhealthy; "
                "the gang restarts whole"
            )
    # A slice or share holds no whole GPU (its mask is empty): its GPU is in the sharing ledger.
    for spot in ctx.state.sharing.spots_of(job.job_id):
        record = ctx.state.node_record(spot.node_id)
        if record is not None and spot.gpus and record.unhealthy_mask >> spot.gpus[0] & 1:
            return "gpu_unhealthy", (
                f"GPU {spot.gpus[0]} of node {spot.node_id} became unhealthy; "
                "the gang restarts whole"
            )
    return None


def draining_node_of(ctx: CycleContext, job: CoreJob) -> str | None:
    """A draining node of the gang whose drain must move it now (its deadline, if any,
    has come; until then the gang runs on and the cycle wakes at the deadline)."""
    nodes = ctx.state.node_records
    for node_index, _ in job.ranks:
        node = nodes[node_index]
        if not node.draining:
            continue
        if node.drain_deadline is not None and node.drain_deadline > ctx.now:
            ctx.wakeups.append(node.drain_deadline)
            continue
        return node.node_id
    return None


def react_to_drains(ctx: CycleContext) -> None:
    nodes = ctx.state.node_records
    for index in sorted(ctx.state.draining_nodes):
        node = nodes[index]
        if not node.draining:
            continue
        if all(job_id in ctx.released for job_id in node.gangs):
            ctx.emit(NodeDrained(node_id=node.node_id))
