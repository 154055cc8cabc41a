"""While the estimator learns, the holding gangs' timers renew only the estimated ends that may
have moved (the learned teams' gangs, and those read from what every team feeds): cycle after
cycle, the kept planner decides and wakes up exactly as one that visits every holding gang.
Few job names per team, so that their keys and ratios mature within a short history; eight
teams, so that a learn of one or two renews gang by gang and one of more rebuilds."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from core.cycle import Planner
from tests.core.builders import History, a_job
from tests.core.test_timers import cycles_agree

submissions = st.tuples(
    st.sampled_from(("a", "b", "c", "d", "e", "f", "g", "h")),
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


def test_a_gang_whose_team_learned_gets_a_new_estimated_end_when_few_teams_learned() -> None:
    history = History("4x8:2:1")
    planner = Planner()

    def finish(job_id: str, after_s: float) -> None:
        cycles_agree(history, planner, start=True)
        history.advance(after_s)
        history.exit(job_id, 0)
        cycles_agree(history, planner, start=True)

    for team in ("a", "b", "c", "d", "e", "f", "g", "h"):
        # Every team learned once: a learn of one team then renews gang by gang.
        finish(history.submit(a_job().named("warmup").team(team).gpus(1))[0], 60.0)
    for ran_s in (1000.0, 2000.0, 3000.0):  # team a's "train" predicts 2,000 s
        finish(history.submit(a_job().named("train").team("a").gpus(1))[0], ran_s)
    learner = history.submit(a_job().named("train").team("a").gpus(1))[0]
    cycles_agree(history, planner, start=True)
    history.advance(2495.0)
    running = history.submit(a_job().named("train").team("a").gpus(1))[0]
    cycles_agree(history, planner, start=True)
    learned = history.state.estimates.learned
    # The learner ends after 2,500 s: "train" now predicts 2,500 s, and the running gang's
    # estimated end (the next wake-up) moves 500 s later.
    finish(learner, 5.0)

    assert history.state.estimates.teams_learned_since(learned) == frozenset({"a"})
    assert history.job(running).state == "running"
