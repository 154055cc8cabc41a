"""While the estimator learns, the holding gangs' timers renew only the estimated ends that may
have moved (the learned teams' gangs, and those read from what every team feeds): cycle after
cycle, the kept planner decides and wakes up exactly as one that visits every holding gang.
Few job names per team, so that their keys and ratios mature within a short history."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from core.cycle import Planner
from tests.core.builders import History, a_job
from tests.core.test_timers import cycles_agree

submissions = st.tuples(
    st.sampled_from(("a", "b", "c")),
    st.sampled_from(("train", "eval")),
    st.sampled_from((1, 2, 4)),
    st.sampled_from((None, 120.0, 900.0)),
)


@settings(max_examples=40, deadline=None)
@given(
    steps=st.lists(
        st.tuples(
            st.lists(submissions, max_size=4),
            st.integers(min_value=0, max_value=3),
            st.sampled_from([30.0, 200.0, 1000.0]),
        ),
        min_size=3,
        max_size=14,
    )
)
def test_a_planner_whose_timers_follow_what_is_learned_decides_as_one_visiting_every_gang(
    steps: list[tuple[list[tuple[str, str, int, float | None]], int, float]],
) -> None:
    history = History("2x8:2:1")
    planner = Planner()
    for submitted, exits, wait in steps:
        for team, name, gpus, estimate in submitted:
            job = a_job().named(name).team(team).gpus(gpus)
            history.submit(job if estimate is None else job.estimate(estimate))
        cycles_agree(history, planner, start=True)
        running = sorted(v.job_id for v in history.state.jobs() if v.state == "running")
        for job_id in running[:exits]:
            history.exit(job_id, 0)
        history.advance(wait)
        cycles_agree(history, planner, start=True)
