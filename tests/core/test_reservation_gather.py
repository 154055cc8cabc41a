"""The head's reservation plan gathers the GPUs the running gangs give back per node and lets
them into the snapshot only before a try (core/reservation.py `plan_reservation`): it plans
exactly what releasing them rank by rank plans (the reference, `gather=False`), and leaves the
snapshot as it found it."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from core.context import CycleContext
from core.placement import Snapshot, shape_of
from core.reservation import plan_reservation
from tests.core.builders import History, a_job
from tests.core.test_snapshot_upkeep import aggregates

HOUR = 3600.0
CLUSTER = "8x8:2:2"  # 8 nodes of 8 GPUs, 2 nodes a rack, 2 racks a block: 2 blocks

# A running gang: (node, GPUs, quarter hours to its estimated end). More than EAGER_TRIES
# distinct ends, so that the plan also skips tries and takes its last look.
gangs = st.lists(
    st.tuples(
        st.integers(min_value=0, max_value=7),
        st.sampled_from([1, 1, 2, 4]),
        st.integers(min_value=1, max_value=80),
    ),
    max_size=48,
)
heads = st.sampled_from(
    [
        a_job().gpus(8),
        a_job().gpus(4).tasks(3),
        a_job().gpus(8).tasks(4).require("block"),
        a_job().gpus(2).tasks(8).require("rack"),
        a_job().gpus(8).tasks(8),
        a_job().gpus(1).tasks(40),
    ]
)


@settings(max_examples=200, deadline=None)
@given(
    running=gangs,
    broken=st.lists(st.tuples(st.integers(0, 7), st.integers(0, 7)), max_size=3),
    lost=st.lists(st.integers(0, 7), max_size=1),
    head=heads,
)
def test_a_plan_gathering_releases_per_node_plans_what_releasing_rank_by_rank_plans(
    running: list[tuple[int, int, int]],
    broken: list[tuple[int, int]],
    lost: list[int],
    head: object,
) -> None:
    history = History(CLUSTER)
    for node, gpus, quarters in running:
        node_id = f"n{node:04d}"
        view = history.state.node(node_id)
        assert view is not None
        held = sum(len(job.placement.get(node_id, [])) for job in history.state.jobs())
        if held + gpus <= view.gpus:
            history.occupy(node_id, gpus, a_job().preemptible(False).estimate(quarters * HOUR / 4))
    # GPUs that broke and a node lost under running gangs give nothing back to plan with.
    for node, gpu in broken:
        history.break_gpu(f"n{node:04d}", gpu)
    for node in lost:
        history.lose(f"n{node:04d}")
    history.advance(60.0)
    state = history.state
    assert hasattr(head, "spec")
    shape = shape_of(head.spec())
    ctx = CycleContext.start(state, history.now)
    snap = Snapshot(state.node_records, state.free_masks)
    before = aggregates(snap)

    gathered = plan_reservation(ctx, snap, shape)
    assert aggregates(snap) == before
    one_by_one = plan_reservation(ctx, snap, shape, gather=False)
    assert aggregates(snap) == before

    assert gathered == one_by_one
