"""The job read model folded from histories: the state machine of DESIGN §5."""

from __future__ import annotations

from datetime import UTC, datetime

from schemas.base import Event
from schemas.jobs import (
    JobAdmitted,
    JobCancelled,
    JobDeferred,
    JobFailed,
    JobRejected,
    JobRequeued,
    JobResumed,
    JobSucceeded,
    JobSuspended,
    PreemptionRequested,
    ReservationPlanned,
    TaskExited,
    TaskStarted,
)
from services.api.projections.jobs import JobReadModel, request_allowed
from services.api.projections.model import ReadModels
from tests.api.builders import Log, reserved, submitted

J = "j1"


def fold(*events: Event) -> JobReadModel:
    models = ReadModels()
    models.apply_all(Log().record(*events))
    return models.jobs[J]


def admitted() -> JobAdmitted:
    return JobAdmitted(job_id=J, queue="nlp-q", priority="production")


def gang(attempt: int = 1) -> Event:
    return reserved(J, [("n1", [0, 1, 2, 3]), ("n2", [4, 5, 6, 7])], attempt=attempt)


def started(rank: int, attempt: int = 1) -> TaskStarted:
    return TaskStarted(job_id=J, attempt=attempt, rank=rank, node_id=f"n{rank + 1}")


def test_submitted_job_is_pending_awaiting_admission() -> None:
    job = fold(submitted(J))
    assert (job.state, job.reason, job.gpus) == ("pending", "awaiting admission", 8)


def test_admitted_job_is_queued_in_the_queue_admission_resolved() -> None:
    job = fold(submitted(J), admitted())
    assert (job.state, job.queue, job.priority) == ("queued", "nlp-q", "production")


def test_rejected_job_is_rejected_with_the_reason() -> None:
    job = fold(submitted(J), JobRejected(job_id=J, code="quota", reason="over the team ceiling"))
    assert (job.state, job.reason, job.reason_code) == (
        "rejected",
        "over the team ceiling",
        "quota",
    )


def test_deferred_job_keeps_waiting_with_the_scheduler_reason() -> None:
    deferred = JobDeferred(job_id=J, code="no_capacity", message="needs 8 GPUs; 4 are free")
    job = fold(submitted(J), admitted(), deferred)
    assert (job.state, job.reason) == ("queued", "needs 8 GPUs; 4 are free")


def test_reservation_planned_gives_the_estimated_start() -> None:
    at = datetime(2026, 11, 21, 14, 20, tzinfo=UTC)
    planned = ReservationPlanned(job_id=J, start_at=at, nodes=["n1", "n2"])
    job = fold(submitted(J), admitted(), planned)
    assert (job.estimated_start, job.planned_nodes) == (at, ("n1", "n2"))


def test_a_head_that_is_no_longer_the_head_shows_no_estimated_start() -> None:
    """Another job took the head's place (its reservation is the other's now): as in the
    core's state, the job's reservation is gone with it, so `gangway why` shows the reason
    it waits for now and no estimated start left over from the reservation it lost."""
    at = datetime(2026, 11, 21, 14, 20, tzinfo=UTC)
    head = JobDeferred(job_id=J, code="reserved_head", message="needs 8 GPUs; earliest at 14:20")
    planned = ReservationPlanned(job_id=J, start_at=at, nodes=["n1"])
    behind = JobDeferred(job_id=J, code="no_capacity", message="needs 8 GPUs; waiting")
    job = fold(submitted(J), admitted(), planned, head, behind)
    assert (job.reason_code, job.estimated_start, job.planned_nodes) == ("no_capacity", None, ())
    # The head keeps it while it stays the head.
    job = fold(submitted(J), admitted(), planned, head)
    assert (job.estimated_start, job.planned_nodes) == (at, ("n1",))


def test_a_suspended_head_shows_no_estimated_start() -> None:
    """Suspended, it is no longer the head (as in the core's state): `gangway why` showed the
    start of the reservation it held beside 'suspended on request', and after a resume."""
    at = datetime(2026, 11, 21, 14, 20, tzinfo=UTC)
    head = JobDeferred(job_id=J, code="reserved_head", message="needs 8 GPUs; earliest at 14:20")
    planned = ReservationPlanned(job_id=J, start_at=at, nodes=["n1"])
    job = fold(submitted(J), admitted(), planned, head, JobSuspended(job_id=J))
    assert (job.state, job.estimated_start, job.planned_nodes) == ("suspended", None, ())
    job = fold(
        submitted(J), admitted(), planned, head, JobSuspended(job_id=J), JobResumed(job_id=J)
    )
    assert (job.state, job.estimated_start, job.planned_nodes) == ("queued", None, ())


def test_gang_reserved_places_the_gpus_by_node() -> None:
    job = fold(submitted(J), admitted(), gang())
    assert job.state == "reserved"
    assert dict(job.placement) == {"n1": (0, 1, 2, 3), "n2": (4, 5, 6, 7)}
    assert job.attempt == 1


def test_job_is_running_only_once_every_rank_started() -> None:
    assert fold(submitted(J), admitted(), gang(), started(0)).state == "reserved"
    assert fold(submitted(J), admitted(), gang(), started(0), started(1)).state == "running"


def test_a_reserved_gang_says_it_waits_for_its_agents_until_every_rank_started() -> None:
    """Found in an operator's run (Kafka down for five minutes): the gangs reserved meanwhile
    stood `reserved` with no reason at all, `gangway why` included, until the launch timeout
    released them; an agent that cannot hear its reservation looks the same to a user."""
    job = fold(submitted(J), admitted(), gang())
    assert job.reason_code == "launching"
    assert (
        job.reason is not None and "waiting for its node agents to start 2 of its 2" in job.reason
    )
    assert job.reason.endswith("within the launch timeout)")
    job = fold(submitted(J), admitted(), gang(), started(1))
    assert job.reason_code == "launching"
    assert job.reason is not None and "to start 1 of its 2 ranks" in job.reason
    job = fold(submitted(J), admitted(), gang(), started(1), started(0))
    assert (job.state, job.reason, job.reason_code) == ("running", None, None)


def test_preemption_then_requeue_frees_the_gang_and_queues_the_job() -> None:
    preempt = PreemptionRequested(
        job_id=J, attempt=1, preemptor_job_id="j9", reason="reclaimed by j9", grace_s=30
    )
    requeue = JobRequeued(job_id=J, attempt=1, code="preempted", reason="reclaimed by j9")
    history = (submitted(J), admitted(), gang(), started(0), started(1), preempt)
    assert fold(*history).state == "preempting"
    job = fold(*history, requeue)
    assert (job.state, dict(job.placement), job.preemptions) == ("queued", {}, 1)


def test_a_later_attempt_places_the_job_again() -> None:
    requeue = JobRequeued(job_id=J, attempt=1, code="node_lost", reason="n2 was lost")
    job = fold(submitted(J), admitted(), gang(1), requeue, gang(2))
    assert (job.state, job.attempt) == ("reserved", 2)


def test_events_of_an_earlier_attempt_change_nothing() -> None:
    requeue = JobRequeued(job_id=J, attempt=1, code="node_lost", reason="n2 was lost")
    late = TaskStarted(job_id=J, attempt=1, rank=0, node_id="n1")
    job = fold(submitted(J), admitted(), gang(1), requeue, gang(2), started(0, 2), late)
    assert job.started_ranks == frozenset({0})


def test_terminal_job_ignores_late_events() -> None:
    late = TaskExited(job_id=J, attempt=1, rank=0, node_id="n1", exit_code=137)
    history = (submitted(J), admitted(), gang(), JobSucceeded(job_id=J, attempt=1), late)
    job = fold(*history)
    assert (job.state, dict(job.exited_ranks)) == ("succeeded", {})


def test_failed_job_carries_the_failure_reason() -> None:
    failed = JobFailed(job_id=J, attempt=1, reason="rank 1 exited 1 after 3 retries")
    job = fold(submitted(J), admitted(), gang(), failed)
    assert (job.state, job.reason, dict(job.placement)) == (
        "failed",
        "rank 1 exited 1 after 3 retries",
        {},
    )


def test_suspended_job_resumes_into_the_queue() -> None:
    suspended = JobSuspended(job_id=J, attempt=1)
    assert fold(submitted(J), admitted(), gang(), suspended).state == "suspended"
    resumed = fold(submitted(J), admitted(), gang(), suspended, JobResumed(job_id=J))
    assert resumed.state == "queued"


def test_a_job_admitted_while_suspended_before_admission_is_queued_once_resumed() -> None:
    # Admission caught up late (after an outage), after the scheduler had suspended the job.
    suspended = JobSuspended(job_id=J, attempt=None)
    job = fold(submitted(J), suspended, admitted())
    assert (job.state, job.reason_code) == ("suspended", "suspended")
    resumed = fold(submitted(J), suspended, admitted(), JobResumed(job_id=J))
    assert (resumed.state, resumed.queue, resumed.priority) == ("queued", "nlp-q", "production")


def test_a_job_rejected_while_suspended_before_admission_is_rejected() -> None:
    rejected = JobRejected(job_id=J, code="quota", reason="over the team ceiling")
    job = fold(submitted(J), JobSuspended(job_id=J, attempt=None), rejected)
    assert (job.state, job.reason_code) == ("rejected", "quota")


def test_cancel_is_refused_once_the_job_finished() -> None:
    cancelled = fold(submitted(J), admitted(), JobCancelled(job_id=J, reason="by user"))
    assert not request_allowed(cancelled, "cancel")
    assert request_allowed(fold(submitted(J), admitted()), "cancel")


def test_resume_is_allowed_only_for_a_suspended_job() -> None:
    assert not request_allowed(fold(submitted(J), admitted(), gang()), "resume")
    suspended = fold(submitted(J), admitted(), gang(), JobSuspended(job_id=J, attempt=1))
    assert request_allowed(suspended, "resume")
