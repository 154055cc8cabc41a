"""The job read model folds holds, updates and array membership as the core does."""

from __future__ import annotations

from schemas.base import Event
from schemas.jobs import (
    ArraySpec,
    JobAdmitted,
    JobChanges,
    JobHeld,
    JobHoldReleased,
    JobResumed,
    JobSubmitted,
    JobSuspended,
    JobUpdated,
)
from services.api.projections.model import ReadModels
from tests.api.builders import Log, reserved, spec, submitted

J = "j1"


def fold(*events: Event) -> ReadModels:
    models = ReadModels()
    models.apply_all(Log().record(*events))
    return models


def test_a_held_job_says_so_before_and_after_admission_and_after_a_resume() -> None:
    pending = fold(submitted(J, hold=True)).jobs[J]
    assert (pending.held, pending.reason_code) == (True, "held")
    admitted = JobAdmitted(job_id=J, queue="nlp", priority="research")
    queued = fold(submitted(J, hold=True), admitted).jobs[J]
    assert (queued.state, queued.reason_code) == ("queued", "held")
    resumed = fold(
        submitted(J),
        admitted,
        JobHeld(job_id=J, by="u"),
        JobSuspended(job_id=J),
        JobResumed(job_id=J),
    ).jobs[J]
    assert (resumed.state, resumed.reason_code) == ("queued", "held")
    released = fold(
        submitted(J), admitted, JobHeld(job_id=J, by="u"), JobHoldReleased(job_id=J, by="u")
    )
    assert (released.jobs[J].held, released.jobs[J].reason_code) == (False, None)


def test_an_update_changes_the_spec_and_a_class_changed_before_admission_stands() -> None:
    changes = JobChanges(priority="production", max_runtime_s=60)
    job = fold(
        submitted(J),
        JobUpdated(job_id=J, by="u", changes=changes),
        JobAdmitted(job_id=J, queue="nlp", priority="research"),
    ).jobs[J]
    assert (job.priority, job.spec.max_runtime_s, job.spec.priority) == (
        "production",
        60,
        "production",
    )


def test_an_update_arriving_while_the_gang_holds_gpus_changes_nothing() -> None:
    before = fold(
        submitted(J),
        JobAdmitted(job_id=J, queue="nlp", priority="research"),
        reserved(J, [("n1", [0, 1])]),
    ).jobs[J]
    after = fold(
        submitted(J),
        JobAdmitted(job_id=J, queue="nlp", priority="research"),
        reserved(J, [("n1", [0, 1])]),
        JobUpdated(job_id=J, by="u", changes=JobChanges(max_retries=9)),
    ).jobs[J]
    assert after.spec == before.spec


def test_array_elements_are_indexed_under_their_array() -> None:
    shared = spec("nlp", array=ArraySpec(count=2))
    models = fold(
        *(
            JobSubmitted(
                job_id=f"a_{index}", spec=shared, submitted_by="u", array_id="a", array_index=index
            )
            for index in range(2)
        )
    )
    assert models.arrays == {"a": ["a_0", "a_1"]}
    assert (models.jobs["a_1"].array_id, models.jobs["a_1"].array_index) == ("a", 1)
