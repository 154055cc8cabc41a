"""The job read model: one record per job, folded from its stream's events.

`evolve_job` is a pure function (record, event) -> record; the state machine is the one of
DESIGN §5: pending → queued (JobAdmitted) → reserved (GangReserved) → running (every rank's
TaskStarted) → preempting (PreemptionRequested) → queued (JobRequeued) … until a terminal state.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Final, Literal

from schemas.base import Event
from schemas.jobs import (
    HOLDING_STATES as GANG_HOLDING_STATES,
)
from schemas.jobs import (
    TERMINAL_STATES,
    GangReserved,
    JobAdmitted,
    JobCancelled,
    JobCancelRequested,
    JobDeferred,
    JobFailed,
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
    PreemptionRequested,
    ReservationPlanned,
    TaskExited,
    TaskStarted,
)

Request = Literal["cancel", "suspend", "resume"]

AWAITING_ADMISSION = "awaiting admission"
AWAITING_SCHEDULING = "waiting for the scheduler"


@dataclass(frozen=True, slots=True)
class JobReadModel:
    """What the API knows about one job; never mutated, replaced on every event."""

    id: str
    spec: JobSpec
    submitted_by: str
    submitted_at: datetime
    submit_position: int
    queue: str
    priority: str
    updated_at: datetime
    state: JobState = "pending"
    reason: str | None = AWAITING_ADMISSION
    reason_code: str | None = None
    estimated_start: datetime | None = None
    planned_nodes: tuple[str, ...] = ()
    attempt: int = 0
    # node id -> GPU indices of the current attempt's gang; empty when no gang is held.
    placement: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    gang_ranks: frozenset[int] = frozenset()
    started_ranks: frozenset[int] = frozenset()
    exited_ranks: Mapping[int, int] = field(default_factory=dict)
    requests: frozenset[Request] = frozenset()
    preemptions: int = 0
    admitted: bool = False
    finished_at: datetime | None = None

    @property
    def gpus(self) -> int:
        return self.spec.total_gpus

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL_STATES

    @property
    def holds_gpus(self) -> bool:
        return self.state in GANG_HOLDING_STATES


def new_job(event: JobSubmitted, *, at: datetime, position: int) -> JobReadModel:
    spec = event.spec
    return JobReadModel(
        id=event.job_id,
        spec=spec,
        submitted_by=event.submitted_by,
        submitted_at=at,
        submit_position=position,
        queue=spec.queue or spec.team,
        priority=spec.priority,
        updated_at=at,
    )


def evolve_job(
    job: JobReadModel | None, event: Event, *, at: datetime, position: int
) -> JobReadModel | None:
    """The record after `event`; None while the job's JobSubmitted has not been seen."""
    if isinstance(event, JobSubmitted):
        return job if job is not None else new_job(event, at=at, position=position)
    if job is None:
        return None
    if job.terminal:
        # A terminal job's record is final; late facts (a straggling TaskExited) change nothing.
        return job
    changed = _evolve_live(job, event, at)
    return job if changed is None else replace(changed, updated_at=at)


def _evolve_live(job: JobReadModel, event: Event, at: datetime) -> JobReadModel | None:
    match event:
        # Admission decides once, on a pending job; a late duplicate decision changes nothing.
        case JobAdmitted(queue=queue, priority=priority) if job.state == "pending":
            return replace(
                job,
                state="queued",
                queue=queue,
                priority=priority,
                admitted=True,
                reason=AWAITING_SCHEDULING,
                reason_code=None,
            )
        case JobRejected(code=code, reason=reason) if job.state == "pending":
            return _finish(job, "rejected", at, reason=reason, code=code)
        case JobDeferred(code=code, message=message):
            return replace(job, reason=message, reason_code=code)
        case ReservationPlanned(start_at=start_at, nodes=nodes):
            return replace(job, estimated_start=start_at, planned_nodes=tuple(nodes))
        # One gang per attempt: a second GangReserved while one is held would double-bind.
        case GangReserved(attempt=attempt, ranks=ranks) if not job.holds_gpus:
            placement: dict[str, list[int]] = {}
            for rank in ranks:
                placement.setdefault(rank.node_id, []).extend(rank.gpus)
            return replace(
                job,
                state="reserved",
                attempt=attempt,
                placement={node: tuple(sorted(gpus)) for node, gpus in placement.items()},
                gang_ranks=frozenset(rank.rank for rank in ranks),
                started_ranks=frozenset(),
                exited_ranks={},
                reason=None,
                reason_code=None,
                estimated_start=None,
                planned_nodes=(),
            )
        case TaskStarted(attempt=attempt, rank=rank) if _current(job, attempt):
            started = job.started_ranks | {rank}
            running = job.state == "reserved" and job.gang_ranks <= started
            return replace(job, started_ranks=started, state="running" if running else job.state)
        case TaskExited(attempt=attempt, rank=rank, exit_code=code) if _current(job, attempt):
            return replace(job, exited_ranks={**job.exited_ranks, rank: code})
        case PreemptionRequested(attempt=attempt, reason=reason) if _current(job, attempt):
            return replace(
                job,
                state="preempting",
                reason=reason,
                reason_code="preempted",
                preemptions=job.preemptions + 1,
            )
        case JobRequeued(attempt=attempt, code=code, reason=reason) if _current(job, attempt):
            return _release(job, "queued", reason=reason, code=code)
        case JobCancelRequested():
            return replace(job, requests=job.requests | {"cancel"})
        case JobSuspendRequested():
            return replace(job, requests=(job.requests - {"resume"}) | {"suspend"})
        case JobResumeRequested():
            return replace(job, requests=(job.requests - {"suspend"}) | {"resume"})
        case JobSuspended():
            released = _release(job, "suspended", reason="suspended on request", code="suspended")
            return replace(released, requests=released.requests - {"suspend"})
        case JobResumed() if job.state == "suspended":
            # A job suspended before admission goes back to waiting for admission.
            state: JobState = "queued" if job.admitted else "pending"
            reason = AWAITING_SCHEDULING if job.admitted else AWAITING_ADMISSION
            resumed = replace(job, state=state, reason=reason, reason_code=None)
            return replace(resumed, requests=resumed.requests - {"resume"})
        case JobSucceeded():
            return _finish(job, "succeeded", at, reason=None, code=None)
        case JobFailed(reason=reason):
            return _finish(job, "failed", at, reason=reason, code="failed")
        case JobCancelled(reason=reason):
            return _finish(job, "cancelled", at, reason=reason, code="cancelled")
    return None


def _current(job: JobReadModel, attempt: int) -> bool:
    """Whether an event of `attempt` concerns the gang the job holds now."""
    return job.holds_gpus and attempt == job.attempt


def _release(
    job: JobReadModel, state: JobState, *, reason: str | None, code: str | None
) -> JobReadModel:
    return replace(
        job,
        state=state,
        placement={},
        gang_ranks=frozenset(),
        started_ranks=frozenset(),
        reason=reason,
        reason_code=code,
    )


def _finish(
    job: JobReadModel, state: JobState, at: datetime, *, reason: str | None, code: str | None
) -> JobReadModel:
    finished = _release(job, state, reason=reason, code=code)
    return replace(
        finished, finished_at=at, requests=frozenset(), estimated_start=None, planned_nodes=()
    )


# Which user requests each state admits; anything else is a 409 at the API.
ALLOWED_REQUESTS: Final[Mapping[Request, frozenset[JobState]]] = {
    "cancel": frozenset({"pending", "queued", "reserved", "running", "preempting", "suspended"}),
    "suspend": frozenset({"pending", "queued", "reserved", "running", "preempting"}),
    "resume": frozenset({"suspended"}),
}


def request_allowed(job: JobReadModel, request: Request) -> bool:
    return job.state in ALLOWED_REQUESTS[request]
