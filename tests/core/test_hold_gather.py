"""A preemptor awaiting its victims holds the free GPUs it will land on (core/backfill.py
`_hold_for_reclaim`); the victims' GPUs enter the trial gathered per node and the landing is
read, not committed: it must hold exactly what releasing them rank by rank and committing
holds (the reference, `gather=False`), and leave the snapshot as that does, whatever the
victims (several to a node, on broken GPUs, on a lost node) and the preemptor's shape."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from core.backfill import _hold_for_reclaim
from core.context import CycleContext
from core.placement import Snapshot, shape_of
from tests.core.builders import History, a_job
from tests.core.test_snapshot_upkeep import aggregates

CLUSTER = "8x8:2:2"  # 8 nodes of 8 GPUs, 2 nodes a rack, 2 racks a block: 2 blocks

# A running gang: (node, GPUs), placed where it fits (several to a node).
gangs = st.lists(
    st.tuples(st.integers(min_value=0, max_value=7), st.sampled_from([1, 1, 2, 4])),
    max_size=32,
)
preemptors = st.sampled_from(
    [
        a_job().gpus(8),
        a_job().gpus(4).tasks(3),
        a_job().gpus(8).tasks(4).require("block"),
        a_job().gpus(2).tasks(8).require("rack"),
        a_job().gpus(1).tasks(20),
        a_job().gpus(1),
        a_job().gpus(2).tasks(4).tp(2),
        a_job().gpus(1).tasks(6).tp(3),
    ]
)


@settings(max_examples=200, deadline=None)
@given(
    running=gangs,
    chosen=st.lists(st.integers(min_value=0, max_value=31), max_size=12),
    broken=st.lists(st.tuples(st.integers(0, 7), st.integers(0, 7)), max_size=3),
    lost=st.lists(st.integers(0, 7), max_size=1),
    preemptor=preemptors,
    already_held=st.dictionaries(st.integers(0, 7), st.integers(1, 255), max_size=2),
)
def test_a_hold_gathered_and_read_uncommitted_holds_what_the_reference_holds(
    running: list[tuple[int, int]],
    chosen: list[int],
    broken: list[tuple[int, int]],
    lost: list[int],
    preemptor: object,
    already_held: dict[int, int],
) -> None:
    history = History(CLUSTER)
    started: list[str] = []
    for node, gpus in running:
        node_id = f"n{node:04d}"
        view = history.state.node(node_id)
        assert view is not None
        busy = sum(len(job.placement.get(node_id, [])) for job in history.state.jobs())
        if busy + gpus <= view.gpus:
            started.append(history.occupy(node_id, gpus))
    for node, gpu in broken:
        history.break_gpu(f"n{node:04d}", gpu)
    for node in lost:
        history.lose(f"n{node:04d}")
    victims = list(dict.fromkeys(started[i] for i in chosen if i < len(started)))
    state = history.state
    assert hasattr(preemptor, "spec")
    shape = shape_of(preemptor.spec())
    answers = []
    for gather in (True, False):
        ctx = CycleContext.start(state, history.now)
        snap = Snapshot(state.node_records, state.free_masks)
        held = dict(already_held)
        with snap.trial():
            _hold_for_reclaim(ctx, snap, shape, victims, held, gather=gather)
            answers.append((list(held.items()), aggregates(snap)))
    assert answers[0] == answers[1]
