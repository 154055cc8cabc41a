"""The work of the preemption phase is bounded (core/preemption.py): a cycle makes at most
16 preemption plans (MAX_PREEMPTION_ATTEMPTS), the 16th included; the jobs behind them wait
for a later cycle. Shapes that failed are not planned again (they do not count)."""

from __future__ import annotations

from schemas.jobs import PreemptionRequested
from tests.core.builders import History, a_job


def _full_node_and_hopeless_preemptors(history: History, hopeless: int) -> str:
    """Seven GPUs held by a gang that may not be preempted, one by a research gang; then
    `hopeless` production jobs of 8 GPUs, each of its own shape (1, 2, ... CPUs: no failed
    shape spares another a plan), that no eviction can serve; the research gang is returned."""
    history.occupy("n0000", 7)
    research = history.occupy("n0000", 1, a_job().priority("research"))
    history.submit(
        *(a_job().gpus(8).cpus(c).priority("production") for c in range(1, hopeless + 1))
    )
    return research


def test_the_sixteenth_preemption_plan_of_a_cycle_is_still_made() -> None:
    history = History("rack_size: 1\ngroups:\n  - {count: 1, gpus: 8, cpus: 32}\n")
    research = _full_node_and_hopeless_preemptors(history, 15)
    small = history.submit(a_job().gpus(1).priority("production"))[0]

    history.cycle()

    assert [(p.job_id, p.preemptor_job_id) for p in history.events(PreemptionRequested)] == [
        (research, small)
    ]


def test_a_shape_that_found_no_victims_is_not_planned_again_and_costs_no_plan() -> None:
    # Fifteen shapes fail; a sixteenth job of the first one's shape is skipped unplanned, so
    # the 1-GPU job behind it still gets the cycle's sixteenth plan.
    history = History("rack_size: 1\ngroups:\n  - {count: 1, gpus: 8, cpus: 32}\n")
    research = _full_node_and_hopeless_preemptors(history, 15)
    history.submit(a_job().gpus(8).cpus(1).priority("production"))
    small = history.submit(a_job().gpus(1).priority("production"))[0]

    history.cycle()

    assert [(p.job_id, p.preemptor_job_id) for p in history.events(PreemptionRequested)] == [
        (research, small)
    ]


def test_after_sixteen_preemption_plans_a_cycle_plans_no_more() -> None:
    history = History("rack_size: 1\ngroups:\n  - {count: 1, gpus: 8, cpus: 32}\n")
    research = _full_node_and_hopeless_preemptors(history, 16)
    history.submit(a_job().gpus(1).priority("production"))

    history.cycle()

    assert history.events(PreemptionRequested) == []
    assert history.job(research).state == "running"
