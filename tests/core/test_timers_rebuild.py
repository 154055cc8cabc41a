"""The estimated ends built again in one pass (core/timers.py `_rebuild_ends`, run when many
teams learned) are those a fresh index reckons gang by gang (`_rebuild`: `_push`, with
`runtime_estimate` and `_note_ratio` per gang): the same end per gang, under the gang's own
token, and the same ratio notes. Gangs of a few teams with the same given estimate under
different limits, some with no estimate, some with a limit only; exits teach the estimator."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from core import SchedulingPolicy
from core.cycle import Planner
from core.timers import GangTimers
from tests.core.builders import History, a_job

submissions = st.tuples(
    st.sampled_from(("a", "b", "c")),
    st.sampled_from(("train", "eval")),
    st.sampled_from((None, 120.0, 900.0)),
    st.sampled_from((None, 900.0, 1500.0)),
)


def _ends(timers: GangTimers) -> dict[str, float]:
    """Each gang's end as the heap holds it (a live entry: the gang's token and end)."""
    token, end_of = timers._token, timers._end_of
    return {
        job_id: end
        for end, entry_token, job_id in timers._ends
        if token.get(job_id) == entry_token and end_of.get(job_id) == end
    }


@settings(max_examples=60, deadline=None)
@given(
    steps=st.lists(
        st.tuples(
            st.lists(submissions, max_size=5),
            st.integers(min_value=0, max_value=4),
            st.sampled_from([30.0, 200.0, 1000.0]),
        ),
        min_size=2,
        max_size=12,
    ),
    learned=st.booleans(),
)
def test_the_ends_built_again_in_one_pass_are_those_reckoned_gang_by_gang(
    steps: list[tuple[list[tuple[str, str, float | None, float | None]], int, float]],
    learned: bool,
) -> None:
    history = History("4x8:2:1", policy=SchedulingPolicy(learned_runtimes=learned))
    planner = Planner()
    kept = GangTimers()
    for submitted, exits, wait in steps:
        for team, name, estimate, limit in submitted:
            job = a_job().named(name).team(team).gpus(1)
            if estimate is not None:
                job = job.estimate(estimate)
            if limit is not None:
                job = job.max_runtime(limit)
            history.submit(job)
        for decision in planner.schedule(history.state, history.now).decisions:
            history.record(decision)
        history.start_all()
        running = sorted(v.job_id for v in history.state.jobs() if v.state == "running")
        for job_id in running[:exits]:
            history.exit(job_id, 0)
        history.advance(wait)
        kept.gangs_to_visit(history.state, history.now, set())
        kept._rebuild_ends(history.state)
        fresh = GangTimers()
        fresh.gangs_to_visit(history.state, history.now, set())
        assert kept._end_of == fresh._end_of
        assert _ends(kept) == fresh._end_of
        assert len(kept._ends) == len(kept._end_of)
        heap = kept._ends  # a heap: the reactions pop the earliest end first
        assert all(heap[(i - 1) // 2] <= heap[i] for i in range(1, len(heap)))
        assert kept._ratio_of == fresh._ratio_of
        assert {key: set(group) for key, group in kept._by_ratio.items()} == {
            key: set(group) for key, group in fresh._by_ratio.items()
        }
        assert set(kept._unscaled) == set(fresh._unscaled)
        assert kept._learned == history.state.estimates.learned
