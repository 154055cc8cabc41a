"""The dependency verdicts a planner keeps between cycles (core/gating.py `DependencyBook`)
stand only as long as nothing they rest on changed: jobs that end without a decision of the
scheduler's (a rejection by admission) or become known (a submission folded late) are heard
of through the state's watch. The state machine of test_order_book_machine.py checks the
kept verdicts against verdicts worked out afresh over richer histories."""

from __future__ import annotations

from core.cycle import Planner
from schemas.jobs import Dependency, JobCancelled, JobRejected, JobSubmitted
from tests.core.builders import History, a_job


def _rejected(job_id: str) -> JobRejected:
    return JobRejected(job_id=job_id, code="unknown_gpu_type", reason="test")


def _waiting_on(history: History, other: str) -> str:
    [job_id] = history.submit(a_job().team("ml")._set(depends_on=[Dependency(job=other)]))
    return job_id


def test_a_dependency_rejected_by_admission_cancels_its_dependent() -> None:
    history = History("1x8")
    history.team("ml")
    first = a_job().team("ml")
    # Not admitted yet: admission decides on it after its dependent was admitted.
    history.record(JobSubmitted(job_id=first.job_id, spec=first.spec(), submitted_by="test"))
    second = _waiting_on(history, first.job_id)
    history.run(2)
    assert history.job(second).reason_code == "dependency"

    history.record(_rejected(first.job_id))
    history.run(1)

    [cancelled] = history.events(JobCancelled, second)
    assert cancelled.reason.startswith("dependency can never be satisfied")
    assert history.job(second).state == "cancelled"


def test_a_dependency_folded_late_is_no_longer_waited_for_as_unknown() -> None:
    history = History("1x8")
    history.team("ml")
    first = a_job().team("ml")._set(hold=True)
    second = _waiting_on(history, first.job_id)
    history.run(2)
    assert "(not known yet)" in (history.job(second).reason or "")

    history.submit(first)
    history.run(1)

    assert history.job(second).reason == (
        f"needs 1 GPU; waiting for job {first.job_id} to have succeeded"
    )


def test_a_planner_keeps_no_verdict_across_states() -> None:
    # A restarted scheduler's state (a snapshot thawed, or the log folded again) is another
    # state: the verdicts kept of the first are not its verdicts.
    history = History("1x8")
    history.team("ml")
    first = a_job().team("ml")
    history.record(JobSubmitted(job_id=first.job_id, spec=first.spec(), submitted_by="test"))
    second = _waiting_on(history, first.job_id)
    planner = Planner()
    planner.schedule(history.state, history.now)
    other = history.replayed()
    other.apply(_rejected(first.job_id), history.now)

    decisions = planner.schedule(other, history.now + 1).decisions

    assert any(isinstance(d, JobCancelled) and d.job_id == second for d in decisions)
