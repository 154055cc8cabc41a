"""Indexes the state keeps for the cycle's speed (the nodes where released ranks still run,
the holding gangs by queue, the gangs being preempted) name exactly what a walk over its
records would: random clusters, policies and job streams (those of the property tests), with
ranks that start late or never and gangs released while their ranks still run.
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


def indexes_agree(history: History) -> None:
    state = history.state
    assert state.lingering_nodes == lingering_by_walk(history)
    queues = {job.queue for job in state.job_records.values()}
    for queue in queues:
        # The queue's holding gangs, in `holding_jobs` order.
        walked = [job_id for job_id, job in state.holding_jobs.items() if job.queue == queue]
        assert list(state.holding_of(queue)) == walked
    preempting = {job_id for job_id, job in state.holding_jobs.items() if job.state == "preempting"}
    assert set(state.preempting_jobs) == preempting
    assert all(state.preempting_jobs[job_id] is state.holding_jobs[job_id] for job_id in preempting)
    # A gang is bound only to a job it moves to the holding states, and released before the
    # job waits again: no waiting job holds ranks (core/ordering.py's book would key such a
    # job one by one, its attained service growing while it ran: a case that cannot arise).
    assert not any(job.ranks for job in state.waiting_jobs.values())


@given(
    cluster=clusters,
    policy=policies,
    ops=operations,
    starts=st.lists(st.booleans(), min_size=50, max_size=50),
)
def test_the_state_indexes_name_what_a_walk_over_its_records_finds(
    cluster: str, policy: SchedulingPolicy, ops: list[object], starts: list[bool]
) -> None:
    history = History(cluster, policy=policy)
    planner = Planner()
    nodes = [view.node_id for view in history.state.nodes()]
    for number, op in enumerate(ops):
        perform(history, op, f"t{number:03d}", nodes)
        indexes_agree(history)
        for decision in planner.schedule(history.state, history.now).decisions:
            history.record(decision)
            indexes_agree(history)
        if starts[number % len(starts)]:
            history.start_all()
        indexes_agree(history)
