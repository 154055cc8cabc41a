"""The victim pool kept between cycles (core/preemption.py `VictimBook`) is the pool a cycle
builds from every holding gang (`VictimPool.build`, the reference): the same gangs, in the same
groups and order, and the same earliest wake-up when a protection ends, whenever it is asked,
however many changes and protections' ends came between; and a planner keeping it decides
exactly as one building the pool in every cycle that preempts. Random clusters, policies and
job streams (those of the property tests), with minimum runtimes, hysteresis windows and time
passing over them, exits, lost hardware, drains, cancels, suspends and resumes.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from core import SchedulingPolicy
from core.cycle import Planner
from core.preemption import VictimBook, VictimPool
from tests.core.builders import History
from tests.core.test_properties import Wait, clusters, perform, policies
from tests.core.test_timers import operations


def _groups(pool: VictimPool) -> dict[tuple[str, int], list[str]]:
    return {
        name: [victim.job_id for _, victim in entries]
        for name, entries in pool.groups.items()
        if entries
    }


def _cycle(history: History, planner: Planner, start: bool) -> None:
    """Cycles until nothing new, each decided by the keeping planner and by a reference one."""
    for _ in range(6):
        result = planner.schedule(history.state, history.now)
        reference = Planner(kept_victims=False).schedule(history.state, history.now)
        assert result.decisions == reference.decisions
        if not result.skipped:  # a quiet cycle's memo answers with its own earlier wake-up
            assert result.next_wakeup == reference.next_wakeup
        for decision in result.decisions:
            history.record(decision)
        if start:
            history.start_all()
        if not result.decisions:
            return


@given(
    cluster=clusters,
    policy=policies,
    ops=operations,
    asks=st.lists(st.booleans(), min_size=50, max_size=50),
    starts=st.lists(st.booleans(), min_size=50, max_size=50),
)
def test_the_kept_pool_is_the_pool_built_afresh(
    cluster: str,
    policy: SchedulingPolicy,
    ops: list[object],
    asks: list[bool],
    starts: list[bool],
) -> None:
    history = History(cluster, policy=policy)
    planner = Planner()
    book = VictimBook()
    nodes = [view.node_id for view in history.state.nodes()]
    for number, op in enumerate(ops):
        if not perform(history, op, f"t{number:03d}", nodes) and isinstance(op, Wait):
            history.advance(op.seconds)
        _cycle(history, planner, starts[number % len(starts)])
        if not asks[number % len(asks)]:
            continue  # changes and protections' ends pile up until the book is asked
        state, now = history.state, history.now
        kept_wakeups: list[float] = []
        built_wakeups: list[float] = []
        kept = book.pool(state, now, kept_wakeups)
        built = VictimPool.build(state, now, state.policy, built_wakeups)
        assert _groups(kept) == _groups(built)
        assert kept.size == built.size
        assert min(kept_wakeups, default=None) == min(built_wakeups, default=None)
        assert all(moment > now for moment in kept_wakeups)
