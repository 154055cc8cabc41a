"""Indexes the state keeps for the cycle's speed name exactly what a walk over its records
would: random clusters, policies and job streams (those of the property tests), with ranks
that start late or never and gangs released while their ranks still run.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from core import SchedulingPolicy
from core.cycle import Planner
from tests.core.builders import History
from tests.core.test_properties import clusters, perform, policies
from tests.core.test_timers import operations


def lingering_by_walk(history: History) -> set[int]:
    return {node.index for node in history.state.node_records if node.lingering}


@given(
    cluster=clusters,
    policy=policies,
    ops=operations,
    starts=st.lists(st.booleans(), min_size=50, max_size=50),
)
def test_the_lingering_index_names_the_nodes_where_released_ranks_still_run(
    cluster: str, policy: SchedulingPolicy, ops: list[object], starts: list[bool]
) -> None:
    history = History(cluster, policy=policy)
    planner = Planner()
    nodes = [view.node_id for view in history.state.nodes()]
    for number, op in enumerate(ops):
        perform(history, op, f"t{number:03d}", nodes)
        assert history.state.lingering_nodes == lingering_by_walk(history)
        for decision in planner.schedule(history.state, history.now).decisions:
            history.record(decision)
            assert history.state.lingering_nodes == lingering_by_walk(history)
        if starts[number % len(starts)]:
            history.start_all()
        assert history.state.lingering_nodes == lingering_by_walk(history)
