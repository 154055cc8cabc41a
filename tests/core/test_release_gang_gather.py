"""A gang given back to a planning snapshot (core/host.py `release_gang`, what the preemption
planners try their victims with) enters gathered per node: the snapshot, its host resources
and what it answers must be those of releasing it rank by rank (the reference, `gather=False`),
inside a trial and after it, whatever the gangs (several ranks to a node, broken GPUs, a lost
node, host asks)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from core.host import release_gang
from core.placement import Snapshot
from tests.core.builders import History, a_job
from tests.core.test_snapshot_upkeep import aggregates

CLUSTER = "8x8:2:2"

gangs = st.lists(
    st.tuples(
        st.sampled_from([1, 1, 2, 4]),
        st.integers(min_value=1, max_value=6),
        st.sampled_from([0.0, 0.0, 2.0]),
    ),
    min_size=1,
    max_size=8,
)


@settings(max_examples=150, deadline=None)
@given(
    running=gangs,
    broken=st.lists(st.tuples(st.integers(0, 7), st.integers(0, 7)), max_size=3),
    lost=st.lists(st.integers(0, 7), max_size=1),
)
def test_a_gang_released_gathered_per_node_leaves_the_snapshot_as_rank_by_rank(
    running: list[tuple[int, int, float]],
    broken: list[tuple[int, int]],
    lost: list[int],
) -> None:
    history = History(CLUSTER)
    jobs = []
    for gpus, tasks, cpus in running:
        builder = a_job().gpus(gpus).tasks(tasks)
        jobs += history.submit(builder.cpus(cpus) if cpus else builder)
    history.run()
    for node, gpu in broken:
        history.break_gpu(f"n{node:04d}", gpu)
    for node in lost:
        history.lose(f"n{node:04d}")
    state = history.state
    bound = [state.job_records[j] for j in jobs if state.job_records[j].ranks]
    assert bound

    def contents(snap: Snapshot) -> tuple[object, ...]:
        taken = {index: held for index, held in snap.host_taken.items() if held != (0, 0)}
        return aggregates(snap), taken

    answers = []
    for gather in (True, False):
        snap = Snapshot(state.node_records, state.free_masks)
        before = contents(snap)
        with snap.trial():
            for job in bound:
                release_gang(snap, job, gather=gather)
            inside = contents(snap)
        assert contents(snap) == before
        answers.append(inside)
    assert answers[0] == answers[1]
