"""Pipelines, arrays and holds in the scheduling core: who may start, who waits and why.

A job that depends on others waits (reason `dependency`) until they ended as it needs, and is
cancelled with the reason once they never can; an array runs at most `max_parallel` elements at
once; a held job is never placed until released; a waiting job's spec may change.
"""

from __future__ import annotations

from typing import Any

import pytest

from core.dependencies import condition_verdict, dependency_verdict, find_cycle
from schemas.jobs import (
    ArraySpec,
    Dependency,
    GangReserved,
    JobAdmitted,
    JobCancelled,
    JobChanges,
    JobDeferred,
    JobHeld,
    JobHoldReleased,
    JobState,
    JobSubmitted,
    JobUpdated,
    array_element_id,
)
from tests.core.builders import History, JobBuilder


class PipelineJob(JobBuilder):
    def after(self, job_id: str, condition: str = "succeeded") -> PipelineJob:
        depends: list[dict[str, Any]] = list(self._fields.get("depends_on", []))
        depends.append({"job": job_id, "condition": condition})
        self._set(depends_on=depends)
        return self

    def held(self) -> PipelineJob:
        self._set(hold=True)
        return self


def a_step(job_id: str | None = None) -> PipelineJob:
    """A job of one whole node (8 GPUs)."""
    step = PipelineJob(job_id)
    step.gpus(8)
    return step


def submit_array(
    history: History, array_id: str, count: int, max_parallel: int | None
) -> list[str]:
    """The events the API records for an array: one submission per element, all admitted."""
    spec = (
        PipelineJob(array_id)
        .gpus(8)
        ._set(array=ArraySpec(count=count, max_parallel=max_parallel))
        .spec()
    )
    ids = []
    for index in range(count):
        job_id = array_element_id(array_id, index)
        history.record(
            JobSubmitted(
                job_id=job_id,
                spec=spec,
                submitted_by="test",
                array_id=array_id,
                array_index=index,
            )
        )
        history.record(JobAdmitted(job_id=job_id, queue=spec.team, priority=spec.priority))
        ids.append(job_id)
    return ids


# ---------------------------------------------------------------- the rule


@pytest.mark.parametrize(
    ("condition", "state", "verdict"),
    [
        ("succeeded", "succeeded", "met"),
        ("succeeded", "failed", "broken"),
        ("succeeded", "cancelled", "broken"),
        ("succeeded", "rejected", "broken"),
        ("succeeded", "running", "waiting"),
        ("succeeded", None, "waiting"),
        ("finished", "succeeded", "met"),
        ("finished", "failed", "met"),
        ("finished", "cancelled", "met"),
        ("finished", "queued", "waiting"),
        ("failed", "failed", "met"),
        ("failed", "succeeded", "broken"),
        ("failed", "cancelled", "broken"),
        ("failed", "preempting", "waiting"),
    ],
)
def test_each_condition_holds_waits_or_breaks_by_the_state_of_the_job_it_names(
    condition: Any, state: JobState | None, verdict: str
) -> None:
    assert condition_verdict(condition, state) == verdict


def test_all_conditions_must_hold_and_one_broken_breaks_them_all() -> None:
    states: dict[str, JobState] = {"a": "succeeded", "b": "running", "c": "failed"}
    both = [Dependency(job="a"), Dependency(job="b", condition="finished")]
    waiting = dependency_verdict(both, states.get)
    assert waiting.kind == "waiting" and waiting.message == "waiting for job b to have finished"
    broken = dependency_verdict([*both, Dependency(job="c")], states.get)
    assert broken.kind == "broken" and "job c ended failed" in broken.message
    assert dependency_verdict([Dependency(job="a")], states.get).kind == "met"


def test_a_cycle_in_the_dependency_graph_is_found_and_a_dag_passes() -> None:
    dag = {"eval": ["train"], "train": ["prep"], "prep": []}
    assert find_cycle(["eval"], dag) is None
    looped = {**dag, "prep": ["eval"]}
    assert find_cycle(["eval"], looped) == ["eval", "train", "prep", "eval"]
    assert find_cycle(["x"], {"x": ["x"]}) == ["x", "x"]


# ---------------------------------------------------------------- pipelines in the cycle


def test_a_three_stage_pipeline_runs_in_order_and_why_names_the_dependency() -> None:
    history = History("2x8:2:1")
    prep, train, evaluate = "prep", "train", "eval"
    history.submit(a_step(prep).gpus(8), a_step(train).after(prep))
    history.submit(a_step(evaluate).after(train, "finished"))
    history.run()
    assert history.job(prep).state == "running"
    assert history.job(train).state == "queued"
    assert history.job(train).reason_code == "dependency"
    assert f"waiting for job {prep} to have succeeded" in (history.job(train).reason or "")
    history.exit(prep, 0)
    history.run()
    assert history.job(prep).state == "succeeded"
    assert history.job(train).state == "running"
    assert history.job(evaluate).reason_code == "dependency"
    history.exit(train, 0)
    history.run(cycles=2)
    assert history.job(evaluate).state == "running"


def test_when_the_middle_stage_fails_the_last_is_cancelled_with_the_reason() -> None:
    history = History("2x8:2:1")
    history.submit(
        a_step("prep").gpus(8),
        a_step("train").after("prep").retries(0),
        a_step("eval").after("train"),
    )
    history.run()
    history.exit("prep", 0)
    history.run()
    history.exit("train", 1)
    history.run(cycles=2)
    assert history.job("train").state == "failed"
    evaluate = history.job("eval")
    assert evaluate.state == "cancelled"
    assert "job train ended failed" in (evaluate.reason or "")
    assert history.events(GangReserved, "eval") == []
    [cancelled] = history.events(JobCancelled, "eval")
    assert cancelled.attempt is None


def test_a_cleanup_step_runs_only_after_a_failure() -> None:
    history = History("2x8:2:1")
    history.submit(
        a_step("work").gpus(8).retries(0),
        a_step("on-failure").after("work", "failed"),
        a_step("on-success").after("work", "succeeded"),
    )
    history.run()
    history.exit("work", 3)
    history.run(cycles=2)
    assert history.job("on-failure").state == "running"
    assert history.job("on-success").state == "cancelled"


def test_a_replay_gives_the_same_pipeline_state() -> None:
    history = History("2x8:2:1")
    history.submit(a_step("p").gpus(8), a_step("q").after("p"))
    history.run()
    history.exit("p", 0)
    history.run()
    replayed = history.replayed()
    assert [replayed.job(j) for j in ("p", "q")] == [history.job(j) for j in ("p", "q")]


# ---------------------------------------------------------------- holds


def test_a_held_job_is_never_placed_until_released_and_then_ages_from_its_release() -> None:
    history = History("2x8:2:1")
    [job] = history.submit(a_step().held())
    history.run(cycles=3)
    assert history.events(GangReserved, job) == []
    assert history.job(job).reason_code == "held"
    history.record(JobHoldReleased(job_id=job, by="test"))
    assert history.state.job_records[job].queued_at == history.now
    history.run()
    assert history.job(job).state == "running"


def test_a_dependent_job_held_and_released_records_each_reason_in_turn() -> None:
    # Read models learn a waiting job's reason from the JobDeferred the core records: after a
    # hold and its release, the dependency must be recorded again, or the job shows none.
    history = History("2x8:2:1")
    history.submit(a_step("prep"), a_step("train").after("prep"))
    history.run()
    history.record(JobHeld(job_id="train", by="test"))
    history.run()
    history.record(JobHoldReleased(job_id="train", by="test"))
    history.run()
    codes = [event.code for event in history.events(JobDeferred, "train")]
    assert codes == ["dependency", "held", "dependency"]


def test_holding_a_queued_job_keeps_it_off_free_gpus() -> None:
    history = History("1x8:1:1")
    [busy] = history.submit(a_step().gpus(8))
    history.run()
    [waiting] = history.submit(a_step().gpus(8))
    history.record(JobHeld(job_id=waiting, by="test"))
    history.exit(busy, 0)
    history.run(cycles=2)
    assert history.job(waiting).state == "queued"
    assert history.job(waiting).reason_code == "held"


# ---------------------------------------------------------------- arrays


def test_an_array_of_twenty_never_runs_more_than_four_elements_at_once() -> None:
    history = History("16x8:4:2")
    elements = submit_array(history, "arr", 20, max_parallel=4)
    most = 0
    finished: set[str] = set()
    for _ in range(40):
        history.run()
        running = [j for j in elements if history.job(j).state in ("reserved", "running")]
        most = max(most, len(running))
        for job_id in running[:2]:
            history.exit(job_id, 0)
            finished.add(job_id)
    assert most == 4
    assert all(history.job(j).state == "succeeded" for j in elements)
    waiting_reasons = {d.code for j in elements for d in history.deferrals(j)}
    assert "array_limit" in waiting_reasons


def test_a_reserved_element_whose_ranks_have_not_started_counts_against_max_parallel() -> None:
    history = History("4x8:2:2")
    first, second = submit_array(history, "arr", 2, max_parallel=1)
    history.run(agents=False)  # reserved; its agent has not started it yet
    assert history.job(first).state == "reserved"
    history.run(agents=False)
    assert history.job(second).state == "queued"
    assert history.deferrals(second)[-1].code == "array_limit"


def test_a_cancelled_element_whose_rank_still_runs_still_counts_against_max_parallel() -> None:
    """A cancelled element's rank may take its stop timeout to die (SIGTERM ignored until the
    SIGKILL): it still holds its GPUs on the hardware, so the next element waits for its
    TaskExited. Seen on a live stack: a max_parallel 1 array ran two elements for 5 s."""
    history = History("4x8:2:2")
    first, second, _ = submit_array(history, "arr", 3, max_parallel=1)
    history.run(agents=True)
    assert history.job(first).state == "running"
    history.cancel(first)
    history.run(agents=False)  # the agent has not stopped the rank yet
    assert history.job(first).state == "cancelled"
    assert history.job(second).state == "queued"
    assert history.deferrals(second)[-1].code == "array_limit"
    history.run(agents=False)  # nor in the next cycle
    assert history.job(second).state == "queued"
    history.exit(first, -9, reason="stopped")
    history.run(agents=False)
    assert history.job(second).state == "reserved"
    assert history.replayed().job(second) == history.state.job(second)


def test_an_array_without_a_limit_starts_every_element_that_fits() -> None:
    history = History("4x8:4:1")
    elements = submit_array(history, "wide", 4, max_parallel=None)
    history.run()
    assert all(history.job(j).state == "running" for j in elements)


# ---------------------------------------------------------------- updates


def test_an_update_changes_a_waiting_jobs_class_and_limits() -> None:
    history = History("1x8:1:1")
    [job] = history.submit(a_step().held())
    changes = JobChanges(priority="production", max_runtime_s=600, max_retries=1)
    history.record(JobUpdated(job_id=job, by="test", changes=changes))
    record = history.state.job_records[job]
    assert record.priority == "production"
    assert record.spec is not None and record.spec.max_runtime_s == 600
    assert record.spec.max_retries == 1 and record.spec.estimated_runtime_s is None


def test_an_update_before_admission_survives_the_admission() -> None:
    history = History("1x8:1:1")
    spec = a_step("early").gpus(8).spec()
    history.record(JobSubmitted(job_id="early", spec=spec, submitted_by="test"))
    history.record(JobUpdated(job_id="early", by="test", changes=JobChanges(priority="production")))
    history.record(JobAdmitted(job_id="early", queue=spec.team, priority=spec.priority))
    assert history.state.job_records["early"].priority == "production"


def test_a_job_held_for_long_within_its_guarantee_is_no_reclaim_failure_of_the_scheduler() -> None:
    # ops is guaranteed a node; beta borrows all four. An ops job held for two hours waits
    # by its team's choice: once released, it reclaims its guarantee, and the auditor finds
    # nothing to say about the hours it was held.
    history = History("4x8:4:1")
    history.team("ops", guaranteed=8).team("beta", guaranteed=8)
    borrowers = history.submit(*(a_step().team("beta").estimate(86400) for _ in range(4)))
    history.run()
    assert all(history.job(job).state == "running" for job in borrowers)
    [held] = history.submit(a_step("held-ops").held().team("ops"))
    history.run()
    assert history.job(held).reason_code == "held"
    history.advance(7200)
    history.record(JobHoldReleased(job_id=held, by="test"))
    history.run()
    for _ in range(3):
        for job in borrowers:
            if history.job(job).state == "preempting":
                history.evict(job)
        history.run()
    assert history.job(held).state == "running"
    assert history.auditor.violations == []


def test_an_element_waiting_behind_elements_tried_this_cycle_is_not_told_they_run() -> None:
    """Elements ahead of it take an array's room in the cycle they go to placement, whether or
    not they fit: with none running, the rest were told "array X already runs 2 elements, its
    max_parallel" (seen on a live stack with 4 queued, 0 running, behind a queue's ceiling)."""
    history = History("1x8:1:1")
    history.occupy("n0000", 8)
    first, second, third, _ = submit_array(history, "arr", 4, max_parallel=2)
    history.run(agents=False)
    assert [history.job(j).state for j in (first, second, third)] == ["queued"] * 3
    behind = history.deferrals(third)[-1]
    assert behind.code == "array_limit"
    assert "already runs" not in behind.message, behind.message
    assert "hold GPUs or are tried ahead of it" in behind.message, behind.message


def test_an_element_waiting_for_its_array_s_room_is_told_once() -> None:
    """The reason does not count the elements running: a new count would be a new reason,
    an event for each waiting element whenever one starts or ends."""
    history = History("4x8:2:2")
    elements = submit_array(history, "arr", 6, max_parallel=2)
    for _ in range(4):
        history.run()
        for job_id in elements:
            if history.job(job_id).state == "running":
                history.exit(job_id, 0)
                break
    last = elements[-1]
    assert history.job(last).state == "queued"
    assert [d.code for d in history.deferrals(last)] == ["array_limit"]


def test_an_element_of_an_array_one_at_a_time_is_told_of_one_element() -> None:
    """attack12: `max_parallel: 1` read "array X starts at most 1 elements at once"."""
    history = History("1x8:1:1")
    history.occupy("n0000", 8)
    _, second = submit_array(history, "arr", 2, max_parallel=1)
    history.run(agents=False)
    behind = history.deferrals(second)[-1]
    assert behind.code == "array_limit"
    assert "starts at most 1 element at once" in behind.message, behind.message
