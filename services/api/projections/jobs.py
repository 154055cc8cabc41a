"""The job read model: one record per job, folded from its stream's events.

`evolve_job` is a pure function (record, event) -> record; the state machine is the one of
DESIGN §5: pending → queued (JobAdmitted) → reserved (GangReserved) → running (every rank's
TaskStarted) → preempting (PreemptionRequested) → queued (JobRequeued) … until a terminal state.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from datetime import datetime
from operator import attrgetter
from typing import Any, Final, Literal

from core.live_sharing import GpuAmount, placement_gpus
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
from schemas.reasons import RESERVED_HEAD

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
    # The current gang's ranks as placed: a slice's MIG instance, a share's part of its GPU.
    ranks: tuple[RankPlacement, ...] = ()
    started_ranks: frozenset[int] = frozenset()
    exited_ranks: Mapping[int, int] = field(default_factory=dict)
    # (attempt, rank) -> the node it started on: whose agent holds its log (routers/logs.py).
    rank_nodes: Mapping[tuple[int, int], str] = field(default_factory=dict)
    requests: frozenset[Request] = frozenset()
    preemptions: int = 0
    admitted: bool = False
    finished_at: datetime | None = None
    held: bool = False
    # Its priority class was changed by an update: admission's decision does not undo it.
    priority_changed: bool = False
    # An array element: its array's id and its index there.
    array_id: str | None = None
    array_index: int | None = None

    @property
    def gpus(self) -> int:
        return self.spec.total_gpus

    @property
    def held_gpus(self) -> GpuAmount:
        """What the current gang holds, exactly (a 1g slice of an H100: 1/7); 0 without one."""
        if not self.ranks:
            return sum(len(gpus) for gpus in self.placement.values())
        return sum((placement_gpus(rank) for rank in self.ranks), 0)

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL_STATES

    @property
    def holds_gpus(self) -> bool:
        return self.state in GANG_HOLDING_STATES


_FIELDS: Final = tuple(f.name for f in fields(JobReadModel))
_FIELD_INDEX: Final = {name: index for index, name in enumerate(_FIELDS)}
_FIELD_VALUES: Final = attrgetter(*_FIELDS)
# The slots' own setters: a record is built field by field without the frozen class's
# __setattr__ refusal, as its generated __init__ does.
_FIELD_SETTERS: Final = tuple(getattr(JobReadModel, name).__set__ for name in _FIELDS)


def _changed(job: JobReadModel, **changes: Any) -> JobReadModel:
    """`dataclasses.replace(job, **changes)` (the same record, a new object) at about half its
    cost: the fold copies a 31-field record for nearly every event (JobAdmitted and
    GangReserved of every job), and `replace` walks the class's fields and calls `__init__`
    with each by keyword. No field has a `__post_init__` or an `init=False` to honour."""
    values = list(_FIELD_VALUES(job))
    for name, value in changes.items():
        values[_FIELD_INDEX[name]] = value
    record: JobReadModel = object.__new__(JobReadModel)
    for set_field, value in zip(_FIELD_SETTERS, values, strict=True):
        set_field(record, value)
    return record


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
        reason=HELD_REASON if spec.hold else AWAITING_ADMISSION,
        reason_code="held" if spec.hold else None,
        held=spec.hold,
        array_id=event.array_id,
        array_index=event.array_index,
    )


def evolve_job(
    job: JobReadModel | None, event: Event, *, at: datetime, position: int
) -> JobReadModel | None:
    """The record after `event`; None while the job's JobSubmitted has not been seen."""
    fold = _JOB_FOLDS.get(type(event))
    return job if fold is None else fold(job, event, at, position)


# A fold of the table: (record or None, event, recorded at, log position) -> record or None.
_Fold = Callable[[JobReadModel | None, Any, datetime, int], JobReadModel | None]
# A fold of a live record: the record changed by the event, or None when it changes nothing.
_LiveFold = Callable[[JobReadModel, Any, datetime], JobReadModel | None]


def _on_submitted(
    job: JobReadModel | None, event: JobSubmitted, at: datetime, position: int
) -> JobReadModel:
    return job if job is not None else new_job(event, at=at, position=position)


def _live(fold: _LiveFold) -> _Fold:
    """`fold` applied to a submitted, non-terminal job only, stamping `updated_at` on a change."""

    def folded(
        job: JobReadModel | None, event: Event, at: datetime, position: int
    ) -> JobReadModel | None:
        if job is None:
            return None
        if job.terminal:
            # A terminal job's record is final; late facts (a straggling TaskExited) change
            # nothing.
            return job
        changed = fold(job, event, at)
        if changed is None:
            return job
        if changed is job:
            return _changed(job, updated_at=at)
        # The fold made this record just now and nothing else holds it yet: stamped in place
        # rather than copied a second time (dataclasses.replace of its 31 fields, twice per
        # event, was a sixth of the API's CPU in a batch burst).
        object.__setattr__(changed, "updated_at", at)
        return changed

    return folded


def _awaits_admission(job: JobReadModel) -> bool:
    # Admission decides once, on a pending job or one suspended before it decided (admission
    # catching up late, after an outage); a late duplicate decision changes nothing.
    return not job.admitted and job.state in ("pending", "suspended")


def _on_admitted(job: JobReadModel, event: JobAdmitted, at: datetime) -> JobReadModel | None:
    if not _awaits_admission(job):
        return None
    # A class changed by an update before admission stands (as in the core).
    priority = job.priority if job.priority_changed else event.priority
    if job.state == "suspended":
        # Queued once resumed (as in the core).
        return _changed(job, queue=event.queue, priority=priority, admitted=True)
    held = job.held
    return _changed(
        job,
        state="queued",
        queue=event.queue,
        priority=priority,
        admitted=True,
        reason=HELD_REASON if held else AWAITING_SCHEDULING,
        reason_code="held" if held else None,
    )


def _on_rejected(job: JobReadModel, event: JobRejected, at: datetime) -> JobReadModel | None:
    if not _awaits_admission(job):
        return None
    return _finish(job, "rejected", at, reason=event.reason, code=event.code)


def _on_deferred(job: JobReadModel, event: JobDeferred, at: datetime) -> JobReadModel:
    if event.code == RESERVED_HEAD:
        return _changed(job, reason=event.message, reason_code=event.code)
    # No longer the head (as in the core's state): its reservation, and the estimated start
    # `why` shows beside the reason, went to another job.
    return _changed(
        job, reason=event.message, reason_code=event.code, estimated_start=None, planned_nodes=()
    )


def _on_reservation_planned(
    job: JobReadModel, event: ReservationPlanned, at: datetime
) -> JobReadModel:
    return _changed(job, estimated_start=event.start_at, planned_nodes=tuple(event.nodes))


def _on_gang_reserved(job: JobReadModel, event: GangReserved, at: datetime) -> JobReadModel | None:
    # One gang per attempt: a second GangReserved while one is held would double-bind.
    if job.holds_gpus:
        return None
    placement: dict[str, list[int]] = {}
    for rank in event.ranks:
        placement.setdefault(rank.node_id, []).extend(rank.gpus)
    return _changed(
        job,
        state="reserved",
        attempt=event.attempt,
        placement={node: tuple(sorted(gpus)) for node, gpus in placement.items()},
        gang_ranks=frozenset(rank.rank for rank in event.ranks),
        ranks=tuple(event.ranks),
        started_ranks=frozenset(),
        exited_ranks={},
        reason=launching_reason(len(event.ranks), 0),
        reason_code=LAUNCHING,
        estimated_start=None,
        planned_nodes=(),
    )


# A reserved gang waits for its agents to start its ranks: seconds, or as long as they cannot
# hear the reservation (the bus away) or cannot report the start (the log away). It said
# nothing before: a job stood `reserved` with no reason for the five minutes of a broker
# outage, until the launch timeout released it.
LAUNCHING = "launching"


def launching_reason(ranks: int, started: int) -> str:
    waiting = "its rank" if ranks == 1 else f"{ranks - started} of its {ranks} ranks"
    return (
        f"placed; waiting for its node agents to start {waiting} (the gang is released if "
        "they have not started it within the launch timeout)"
    )


def _on_task_started(job: JobReadModel, event: TaskStarted, at: datetime) -> JobReadModel | None:
    if not _current(job, event.attempt):
        return None
    started = job.started_ranks | {event.rank}
    running = job.state == "reserved" and job.gang_ranks <= started
    nodes = {**job.rank_nodes, (event.attempt, event.rank): event.node_id}
    if running:
        return _changed(
            job,
            started_ranks=started,
            rank_nodes=nodes,
            state="running",
            reason=None,
            reason_code=None,
        )
    if job.state != "reserved":
        return _changed(job, started_ranks=started, rank_nodes=nodes)
    waiting = launching_reason(len(job.gang_ranks), len(job.gang_ranks & started))
    return _changed(job, started_ranks=started, rank_nodes=nodes, reason=waiting)


def _on_task_exited(job: JobReadModel, event: TaskExited, at: datetime) -> JobReadModel | None:
    if not _current(job, event.attempt):
        return None
    return _changed(job, exited_ranks={**job.exited_ranks, event.rank: event.exit_code})


def _on_preemption_requested(
    job: JobReadModel, event: PreemptionRequested, at: datetime
) -> JobReadModel | None:
    if not _current(job, event.attempt):
        return None
    return _changed(
        job,
        state="preempting",
        reason=event.reason,
        reason_code="preempted",
        preemptions=job.preemptions + 1,
    )


def _on_requeued(job: JobReadModel, event: JobRequeued, at: datetime) -> JobReadModel | None:
    if not _current(job, event.attempt):
        return None
    return _release(job, "queued", reason=event.reason, code=event.code)


def _on_cancel_requested(
    job: JobReadModel, event: JobCancelRequested, at: datetime
) -> JobReadModel:
    return _changed(job, requests=job.requests | {"cancel"})


def _on_suspend_requested(
    job: JobReadModel, event: JobSuspendRequested, at: datetime
) -> JobReadModel:
    return _changed(job, requests=(job.requests - {"resume"}) | {"suspend"})


def _on_resume_requested(
    job: JobReadModel, event: JobResumeRequested, at: datetime
) -> JobReadModel:
    return _changed(job, requests=(job.requests - {"suspend"}) | {"resume"})


def _on_suspended(job: JobReadModel, event: JobSuspended, at: datetime) -> JobReadModel:
    released = _release(job, "suspended", reason="suspended on request", code="suspended")
    # No longer the head (as in the core's state): its reservation and estimated start go.
    return _changed(
        released,
        requests=released.requests - {"suspend"},
        estimated_start=None,
        planned_nodes=(),
    )


def _on_resumed(job: JobReadModel, event: JobResumed, at: datetime) -> JobReadModel | None:
    if job.state != "suspended":
        return None
    # A job suspended before admission goes back to waiting for admission.
    state: JobState = "queued" if job.admitted else "pending"
    reason = AWAITING_SCHEDULING if job.admitted else AWAITING_ADMISSION
    if job.held:
        reason = HELD_REASON
    resumed = _changed(job, state=state, reason=reason, reason_code="held" if job.held else None)
    return _changed(resumed, requests=resumed.requests - {"resume"})


HELD_REASON = "held by request: it is never placed until released"


def _on_held(job: JobReadModel, event: JobHeld, at: datetime) -> JobReadModel | None:
    if job.held:
        return None
    waiting = job.state in ("pending", "queued")
    return _changed(
        job,
        held=True,
        reason=HELD_REASON if waiting else job.reason,
        reason_code="held" if waiting else job.reason_code,
    )


def _on_hold_released(
    job: JobReadModel, event: JobHoldReleased, at: datetime
) -> JobReadModel | None:
    if not job.held:
        return None
    if job.state not in ("pending", "queued"):
        return _changed(job, held=False)
    reason = AWAITING_SCHEDULING if job.admitted else AWAITING_ADMISSION
    return _changed(job, held=False, reason=reason, reason_code=None)


def _on_updated(job: JobReadModel, event: JobUpdated, at: datetime) -> JobReadModel | None:
    if job.holds_gpus:
        return None  # as the core: a job holding GPUs keeps its spec
    spec = event.changes.applied_to(job.spec)
    if event.changes.priority is None:
        return _changed(job, spec=spec)
    return _changed(job, spec=spec, priority=spec.priority, priority_changed=True)


def _on_succeeded(job: JobReadModel, event: JobSucceeded, at: datetime) -> JobReadModel:
    return _finish(job, "succeeded", at, reason=None, code=None)


def _on_failed(job: JobReadModel, event: JobFailed, at: datetime) -> JobReadModel:
    return _finish(job, "failed", at, reason=event.reason, code="failed")


def _on_cancelled(job: JobReadModel, event: JobCancelled, at: datetime) -> JobReadModel:
    return _finish(job, "cancelled", at, reason=event.reason, code="cancelled")


# The fold's dispatch table: each event class of a job's stream the read model reads.
_JOB_FOLDS: dict[type[Event], _Fold] = {
    JobSubmitted: _on_submitted,
    JobAdmitted: _live(_on_admitted),
    JobRejected: _live(_on_rejected),
    JobDeferred: _live(_on_deferred),
    ReservationPlanned: _live(_on_reservation_planned),
    GangReserved: _live(_on_gang_reserved),
    TaskStarted: _live(_on_task_started),
    TaskExited: _live(_on_task_exited),
    PreemptionRequested: _live(_on_preemption_requested),
    JobRequeued: _live(_on_requeued),
    JobCancelRequested: _live(_on_cancel_requested),
    JobSuspendRequested: _live(_on_suspend_requested),
    JobResumeRequested: _live(_on_resume_requested),
    JobSuspended: _live(_on_suspended),
    JobResumed: _live(_on_resumed),
    JobSucceeded: _live(_on_succeeded),
    JobFailed: _live(_on_failed),
    JobCancelled: _live(_on_cancelled),
    JobHeld: _live(_on_held),
    JobHoldReleased: _live(_on_hold_released),
    JobUpdated: _live(_on_updated),
}
# The event classes the job read model folds (the model routes only these to `evolve_job`).
JOB_FOLD_TYPES: tuple[type[Event], ...] = tuple(_JOB_FOLDS)


def _current(job: JobReadModel, attempt: int) -> bool:
    """Whether an event of `attempt` concerns the gang the job holds now."""
    return job.holds_gpus and attempt == job.attempt


def _release(
    job: JobReadModel, state: JobState, *, reason: str | None, code: str | None
) -> JobReadModel:
    return _changed(
        job,
        state=state,
        placement={},
        gang_ranks=frozenset(),
        ranks=(),
        started_ranks=frozenset(),
        reason=reason,
        reason_code=code,
    )


def _finish(
    job: JobReadModel, state: JobState, at: datetime, *, reason: str | None, code: str | None
) -> JobReadModel:
    finished = _release(job, state, reason=reason, code=code)
    return _changed(
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
