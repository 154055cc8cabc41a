"""The holding gangs' timers (core/timers.py) change nothing: a planner that keeps them between
cycles decides, cycle after cycle, exactly as one whose reactions visit every holding gang, and
asks for the same next wake-up. Random clusters, policies and job streams (those of the
property tests), with gangs whose ranks start late or never (launch timeouts), exits, lost
hardware, drains, cancels, suspends and time passing over estimates and max runtimes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from core import SchedulingPolicy
from core.cycle import Planner
from core.reservation import runtime_estimate
from schemas.base import Event
from tests.core.builders import History
from tests.core.test_properties import (
    Exit,
    Hardware,
    Request,
    Submit,
    Wait,
    clusters,
    job_of,
    perform,
    policies,
    submits,
)

operations = st.lists(
    st.one_of(
        submits,
        submits,
        st.builds(Exit, pick=st.integers(0, 50), code=st.sampled_from([0, 0, 1])),
        st.builds(
            Hardware,
            kind=st.sampled_from(["lose", "recover", "drain", "undrain", "gpu"]),
            pick=st.integers(0, 50),
        ),
        st.builds(
            Request, kind=st.sampled_from(["cancel", "suspend", "resume"]), pick=st.integers(0, 50)
        ),
        st.builds(Wait, seconds=st.sampled_from([1.0, 60.0, 299.0, 300.0, 900.0, 3600.0])),
    ),
    min_size=10,
    max_size=50,
)


def cycles_agree(history: History, planner: Planner, start: bool) -> None:
    """Cycles until nothing new, each decided by the kept planner and by a reference one."""
    for _ in range(6):
        result = planner.schedule(history.state, history.now)
        reference = Planner(timers=False).schedule(history.state, history.now)
        assert result.decisions == reference.decisions
        if not result.skipped:  # a quiet cycle's memo answers with its own earlier wake-up
            assert result.next_wakeup == reference.next_wakeup
        for decision in result.decisions:
            history.record(decision)
        if start:
            history.start_all()
        if not result.decisions:
            return


def run_agreeing(history: History, ops: list[object], starts: Callable[[int], bool]) -> None:
    """Perform `ops` on `history`, a planner with timers cycling after each and agreeing with
    one that visits every gang; `starts(n)`: whether the gangs placed after op n start."""
    planner = Planner()
    nodes = [view.node_id for view in history.state.nodes()]
    for number, op in enumerate(ops):
        if not perform(history, op, f"t{number:03d}", nodes) and isinstance(op, Wait):
            history.advance(op.seconds)
        cycles_agree(history, planner, starts(number))


@given(
    cluster=clusters,
    policy=policies,
    ops=operations,
    starts=st.lists(st.booleans(), min_size=50, max_size=50),
)
def test_a_planner_with_timers_decides_as_one_visiting_every_gang(
    cluster: str, policy: SchedulingPolicy, ops: list[object], starts: list[bool]
) -> None:
    # Some gangs' ranks start at once, others late or never (their launch times out).
    run_agreeing(History(cluster, policy=policy), ops, lambda number: starts[number % len(starts)])


def test_a_gang_past_its_estimate_asks_a_wakeup_after_the_overrun_grace() -> None:
    history = History("2x8:2:1")
    planner = Planner()
    decisions: list[Event] = []
    history.submit(job_of(_one_gpu(estimate=600.0), "short"))
    decisions += planner.schedule(history.state, history.now).decisions
    for decision in decisions:
        history.record(decision)
    history.start_all()
    history.advance(1000.0)  # past its estimate: it may end at any moment

    result = planner.schedule(history.state, history.now)

    assert result.next_wakeup == history.now + history.policy.overrun_grace_s
    reference = Planner(timers=False).schedule(history.state, history.now)
    assert result.next_wakeup == reference.next_wakeup


def _one_gpu(estimate: float) -> Submit:
    return Submit(
        gpus=1,
        tasks=1,
        min_tasks=None,
        tp=False,
        team="alpha",
        priority="research",
        estimate=estimate,
        max_runtime=None,
        min_runtime=0.0,
        preemptible=None,
        retries=0,
        gpu_type=None,
        require="none",
        prefer="none",
        count=1,
    )


# Jobs with estimates of their own that mostly end well: each team's ratio (ran / estimated,
# core/estimates.py) moves as its jobs end, and with it every running gang's estimated end
# while nothing else of the gang changes (the timers then push its end alone, keeping its
# token and its deadlines).
with_estimates = submits.map(lambda submit: replace(submit, estimate=submit.estimate or 3600.0))
learning = st.lists(
    st.one_of(
        with_estimates,
        with_estimates,
        st.builds(Exit, pick=st.integers(0, 50), code=st.just(0)),
        st.builds(Exit, pick=st.integers(0, 50), code=st.sampled_from([0, 1])),
        st.builds(Wait, seconds=st.sampled_from([30.0, 300.0, 900.0, 3600.0, 20000.0])),
    ),
    min_size=20,
    max_size=60,
)


@given(cluster=clusters, policy=policies, ops=learning)
def test_timers_whose_estimated_ends_move_as_the_estimator_learns_decide_as_every_gang_visited(
    cluster: str, policy: SchedulingPolicy, ops: list[object]
) -> None:
    run_agreeing(History(cluster, policy=policy), ops, lambda number: True)


def kept_ends_agree(history: History, planner: Planner) -> None:
    """What the planner's timers keep after a cycle is what they would work out afresh: each
    gang's estimated end is its estimate now, and the gangs kept by team and noted ratio (those
    looked at when the estimator learns) are exactly those noted with it."""
    timers = planner._timers
    assert timers is not None
    state = history.state
    for job_id, end in timers._end_of.items():
        job = state.holding_jobs[job_id]
        assert job.held_since is not None
        assert end == job.held_since + runtime_estimate(job, state.policy, state.estimates)
    grouped: dict[tuple[str, float | None], set[str]] = {}
    for job_id, noted in timers._ratio_of.items():
        grouped.setdefault(noted, set()).add(job_id)
    assert {key: set(group) for key, group in timers._by_ratio.items()} == grouped
    assert set(timers._unscaled) == set(timers._end_of) - set(timers._ratio_of)


# Jobs of one given estimate, some capped by a limit under it: a team's gangs share the
# estimate, not always the end (the timers work the scaled estimate out once per team, given
# estimate and limit).
one_estimate = submits.map(
    lambda submit: replace(submit, estimate=3600.0, gpus=1, tasks=1, gpu_type=None, count=2)
)
learning_one_estimate = st.lists(
    st.one_of(
        one_estimate,
        one_estimate,
        st.builds(Exit, pick=st.integers(0, 50), code=st.just(0)),
        st.builds(Wait, seconds=st.sampled_from([300.0, 900.0, 3600.0, 20000.0])),
    ),
    min_size=20,
    max_size=60,
)


@given(cluster=clusters, policy=policies, ops=st.one_of(learning, learning_one_estimate))
def test_the_timers_keep_each_gangs_end_as_worked_out_afresh_while_the_estimator_learns(
    cluster: str, policy: SchedulingPolicy, ops: list[object]
) -> None:
    history = History(cluster, policy=policy)
    planner = Planner()
    nodes = [view.node_id for view in history.state.nodes()]
    for number, op in enumerate(ops):
        if not perform(history, op, f"t{number:03d}", nodes) and isinstance(op, Wait):
            history.advance(op.seconds)
        for _ in range(6):
            result = planner.schedule(history.state, history.now)
            kept_ends_agree(history, planner)
            for decision in result.decisions:
                history.record(decision)
            history.start_all()
            if not result.decisions:
                break
