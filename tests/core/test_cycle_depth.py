"""The cycle's bound on newly queued jobs (core/ordering.py `within_depth`): a flood of arrivals
is considered over a few short cycles, in the order's order, every job with a reason meanwhile.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from core import SchedulingPolicy
from schemas.jobs import GangReserved, JobDeferred, PreemptionRequested
from tests.core.builders import History, a_job

CLASSES = ("best-effort", "research", "production")
JOBS = st.tuples(st.sampled_from(CLASSES), st.sampled_from((1, 2, 4, 8)))


def bounded(limit: int, **fields: object) -> SchedulingPolicy:
    return SchedulingPolicy(max_new_jobs_per_cycle=limit, **fields)  # type: ignore[arg-type]


def test_the_bound_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_new_jobs_per_cycle"):
        bounded(0)


def test_a_flood_is_considered_a_bound_of_newcomers_per_cycle_in_arrival_order() -> None:
    history = History("1x8:1:1", policy=bounded(3))
    history.submit(a_job().gpus(8))
    history.run()
    flood = history.submit(*(a_job().gpus(8) for _ in range(7)))

    history.cycle()

    codes = [history.job(job_id).reason_code for job_id in flood]
    assert codes[:3] != ["not_considered"] * 3
    assert "not_considered" not in codes[:3]
    assert codes[3:] == ["not_considered"] * 4
    assert history.cycles[-1].not_considered == 4
    history.cycle()
    assert [history.job(job_id).reason_code for job_id in flood].count("not_considered") == 1
    history.cycle()
    assert "not_considered" not in [history.job(job_id).reason_code for job_id in flood]
    assert history.cycles[-1].not_considered == 0
    assert history.auditor.violations == []
    assert history.auditor.unexplained() == []


def test_the_reason_says_so_and_is_recorded_once() -> None:
    history = History("1x8:1:1", policy=bounded(1))
    history.submit(a_job().gpus(8))
    history.run()
    last = history.submit(*(a_job().gpus(8) for _ in range(4)))[-1]

    history.cycle()
    history.cycle()

    [deferred] = history.deferrals(last)
    assert deferred.code == "not_considered"
    assert "not yet considered" in deferred.message
    assert "at most 1 newly queued jobs" in deferred.message


def test_a_high_class_arrival_behind_a_flood_of_a_lower_one_is_considered_at_once() -> None:
    # A full cluster, a flood of research jobs, then one production job: the next cycle
    # considers it first and evicts a gang for it.
    history = History("2x8:1:1", policy=bounded(2))
    history.submit(*(a_job().gpus(8).priority("best-effort") for _ in range(2)))
    history.run()
    history.advance(3600)
    history.submit(*(a_job().gpus(8).priority("research") for _ in range(20)))
    urgent = history.submit(a_job().gpus(8).priority("production"))[0]

    decisions = history.cycle()

    assert history.job(urgent).reason_code != "not_considered"
    preempted = [e for e in decisions if isinstance(e, PreemptionRequested)]
    assert [e.preemptor_job_id for e in preempted] == [urgent]
    assert history.cycles[-1].not_considered == 19


def test_no_job_behind_the_cut_takes_capacity_from_a_job_ahead_of_it() -> None:
    # Three nodes free up at once; three production arrivals (bound 2) and a research job that
    # waited since before them: it is ordered behind them, so the third node stays free until
    # the third production job is considered, and goes to it.
    history = History("3x8:1:1", policy=bounded(2))
    running = history.submit(*(a_job().gpus(8).priority("research") for _ in range(3)))
    history.run()
    known = history.submit(a_job().gpus(8).priority("research"))[0]
    history.run()
    assert history.job(known).state == "queued"
    for job_id in running:
        history.exit(job_id)
    production = history.submit(*(a_job().gpus(8).priority("production") for _ in range(3)))

    history.run()

    assert [history.job(job_id).state for job_id in production].count("running") == 2
    assert history.job(production[2]).reason_code == "not_considered"
    assert history.job(known).state == "queued"
    history.run()
    assert history.job(production[2]).state == "running"
    assert history.job(known).state == "queued"
    assert history.auditor.violations == []


def test_the_old_head_behind_the_cut_loses_its_reservation() -> None:
    history = History("1x8:1:1", policy=bounded(1))
    history.submit(a_job().gpus(8).priority("best-effort").preemptible(False))
    history.run()
    head = history.submit(a_job().gpus(8).priority("research"))[0]
    history.run()
    assert history.job(head).reason_code == "reserved_head"
    history.submit(*(a_job().gpus(8).priority("production").preemptible(False) for _ in range(2)))

    history.cycle()

    assert history.job(head).reason_code == "not_considered"
    assert history.job(head).estimated_start is None
    assert history.auditor.violations == []


def test_the_default_bound_never_binds_on_a_few_jobs() -> None:
    history = History("2x8:2:1")
    jobs = history.submit(*(a_job().gpus(1) for _ in range(40)))

    history.run()

    assert history.cycles[-1].not_considered == 0
    assert len(history.events(GangReserved)) == 16
    assert not any(e.code == "not_considered" for e in history.events(JobDeferred))
    assert len(jobs) == 40


@settings(max_examples=40, deadline=None)
@given(
    limit=st.integers(1, 6),
    earlier=st.lists(
        st.tuples(st.sampled_from(CLASSES), st.sampled_from((1, 2, 4, 8))), max_size=6
    ),
    flood=st.lists(
        st.tuples(st.sampled_from(CLASSES), st.sampled_from((1, 2, 4, 8))), min_size=1, max_size=25
    ),
)
# A head displaced by the flood (ordered behind it) stays considered: it takes no arrival's place.
@example(
    limit=1,
    earlier=[("research", 1), ("research", 8), ("research", 8)],
    flood=[("best-effort", 1), ("production", 1), ("production", 1)],
)
def test_a_flood_is_all_considered_within_ceil_n_over_k_cycles(
    limit: int, earlier: list[tuple[str, int]], flood: list[tuple[str, int]]
) -> None:
    # Without preemption: a gang requeued by it would be newly queued as well, one more to
    # consider (the bound counts every job not considered since it began waiting).
    history = History("2x8:1:1", policy=bounded(limit, preemption=False))
    history.submit(*(a_job().gpus(gpus).priority(cls) for cls, gpus in earlier))
    for _ in range(math.ceil(len(earlier) / limit) + 1):
        history.run()
    assert history.cycles[-1].not_considered == 0
    arrivals = history.submit(*(a_job().gpus(gpus).priority(cls) for cls, gpus in flood))
    rank = {cls: position for position, cls in enumerate(CLASSES)}

    for cycle in range(math.ceil(len(flood) / limit)):
        decisions = history.cycle()
        history.start_all()
        # Every waiting job has a recorded reason after every cycle (invariant 5).
        assert history.auditor.unexplained() == []
        # The cut follows the order: no job is placed in a cycle that left a job of a
        # higher class unconsidered.
        skipped = [
            history.job(job_id)
            for job_id in arrivals
            if history.job(job_id).reason_code == "not_considered"
        ]
        placed = {e.job_id for e in decisions if isinstance(e, GangReserved)}
        if skipped:
            top = max(rank[job.priority] for job in skipped)
            assert all(rank[history.job(job_id).priority] >= top for job_id in placed)
        assert len(skipped) <= max(0, len(flood) - limit * (cycle + 1))
    assert history.cycles[-1].not_considered == 0
    assert history.auditor.violations == []


@settings(max_examples=40)
@given(jobs=st.lists(st.tuples(JOBS, st.sampled_from((1, 2, 3))), min_size=4, max_size=30))
def test_each_job_behind_the_cut_is_told_its_own_need(
    jobs: list[tuple[tuple[str, int], int]],
) -> None:
    # One outcome is given per need (core/ordering.py `within_depth`): each job's reason must
    # still word that job's need, whatever the needs of the jobs around it.
    history = History("1x8:1:1", policy=bounded(2))
    history.submit(a_job().gpus(8))
    history.run()
    flood = history.submit(
        *(a_job().priority(cls).gpus(gpus).tasks(tasks) for (cls, gpus), tasks in jobs)
    )

    history.cycle()

    said = {event.job_id: event for event in history.events(JobDeferred)}
    behind = [job_id for job_id in flood if history.job(job_id).reason_code == "not_considered"]
    assert len(behind) == history.cycles[-1].not_considered > 0
    for job_id in behind:
        need = history.state.job_records[job_id].need
        assert said[job_id].message.startswith(f"{need}; not yet considered: ")
