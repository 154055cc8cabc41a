"""The free-capacity index kept between cycles (core/placement.py `FreeIndex`) leaves what a
cycle changed in it as it is and reads those nodes again from the state at the next snapshot:
at every snapshot its content is that of an index built afresh from the state, however the
cycle before changed it (gangs bound, GPUs released, trials nested, wide trials, reservations,
host resources), and a planner keeping it decides exactly as one whose index undoes each
cycle's changes when the cycle ends (`Planner(undo_index=True)`, the reference). Random
clusters, policies and job streams (those of the property tests).
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from core import SchedulingPolicy
from core.cycle import Planner
from core.placement import FreeIndex, Snapshot, find_placement
from core.shape import Shape
from tests.core.builders import History
from tests.core.test_properties import Wait, clusters, perform, policies
from tests.core.test_timers import operations


def content(snap: Snapshot) -> tuple[object, ...]:
    """What placement reads of an index, without the empty entries a history leaves."""
    return (
        {index: mask for index, mask in snap.free.items() if mask},
        {index: count for index, count in snap.count.items() if count},
        {
            pool: [set(nodes) for nodes in levels]
            for pool, levels in snap.levels.items()
            if any(levels)
        },
        {rack: set(nodes) for rack, nodes in snap.rack_nodes.items() if nodes},
        {rack: free for rack, free in snap.rack_free.items() if free},
        {block: set(racks) for block, racks in snap.block_racks.items() if racks},
        {block: free for block, free in snap.block_free.items() if free},
        {pool: set(blocks) for pool, blocks in snap.pool_blocks.items() if blocks},
        {pool: free for pool, free in snap.pool_free.items() if free},
        snap.total_free,
        {index: taken for index, taken in snap.host_taken.items() if taken != (0, 0)},
        snap.reserved,
    )


# What a cycle may do to its snapshot: bind a gang of a shape (per task GPUs, tasks), give a
# holding gang's GPUs back, the same inside a nested trial or a wide trial (both undone), pin a
# reservation, take host resources.
changes = st.lists(
    st.one_of(
        st.tuples(st.just("bind"), st.sampled_from([1, 2, 4, 8]), st.integers(1, 4)),
        st.tuples(st.just("release"), st.integers(0, 50), st.just(0)),
        st.tuples(st.just("trial"), st.integers(0, 50), st.sampled_from([1, 2, 8])),
        st.tuples(st.just("wide"), st.integers(0, 50), st.sampled_from([1, 4, 8])),
        st.tuples(st.just("reserve"), st.integers(0, 50), st.just(0)),
        st.tuples(st.just("host"), st.integers(0, 50), st.integers(1, 4)),
    ),
    max_size=8,
)


def _shape(gpus: int, tasks: int) -> Shape:
    return Shape(
        unit_gpus=gpus,
        units=tasks,
        min_units=tasks,
        tasks_per_unit=1,
        gpus_per_task=gpus,
        require="none",
        gpu_type=None,
    )


def _bind(snap: Snapshot, gpus: int, tasks: int) -> None:
    shape = _shape(gpus, tasks)
    allocation = find_placement(snap, shape, False)
    if allocation is not None:
        snap.commit(shape, allocation)


def _release(history: History, snap: Snapshot, pick: int) -> None:
    gangs = [job for job in history.state.holding_jobs.values() if job.ranks]
    if gangs:
        for index, mask in gangs[pick % len(gangs)].ranks:
            snap.release(index, mask)


def change(history: History, snap: Snapshot, kind: str, pick: int, size: int) -> None:
    if kind == "bind":
        _bind(snap, pick, size)
    elif kind == "release":
        _release(history, snap, pick)
    elif kind == "trial":
        with snap.trial():
            _release(history, snap, pick)
            _bind(snap, size, 1)
    elif kind == "wide":
        with snap.wide_trial():
            _release(history, snap, pick)
            _bind(snap, size, 2)
    elif kind == "reserve":
        nodes = sorted(snap.free)
        if nodes:
            snap.reserved = frozenset({nodes[pick % len(nodes)]})
    else:
        snap.shift_host(pick % len(snap.nodes), 1000 * size, 1024 * size)


@given(
    cluster=clusters,
    policy=policies,
    ops=operations,
    cycles=st.lists(changes, min_size=50, max_size=50),
)
def test_the_kept_index_is_at_every_snapshot_the_index_built_from_the_state(
    cluster: str,
    policy: SchedulingPolicy,
    ops: list[object],
    cycles: list[list[tuple[str, int, int]]],
) -> None:
    history = History(cluster, policy=policy)
    index = FreeIndex()
    planner = Planner()
    nodes = [view.node_id for view in history.state.nodes()]
    for number, op in enumerate(ops):
        if not perform(history, op, f"t{number:03d}", nodes) and isinstance(op, Wait):
            history.advance(op.seconds)
        state = history.state
        with index.snapshot(state) as snap:
            assert content(snap) == content(Snapshot(state.node_records, state.free_masks))
            for kind, pick, size in cycles[number % len(cycles)]:
                change(history, snap, kind, pick, size)
        # The state moves on: a cycle's decisions (gangs bound where the snapshot above took
        # GPUs, or elsewhere), ranks started.
        for decision in planner.schedule(state, history.now).decisions:
            history.record(decision)
        history.start_all()
    state = history.state
    with index.snapshot(state) as snap:
        assert content(snap) == content(Snapshot(state.node_records, state.free_masks))


def _cycles_agree(history: History, kept: Planner, undone: Planner, start: bool) -> None:
    """Cycles until nothing new, each decided by both planners (each keeping its index)."""
    for _ in range(6):
        result = kept.schedule(history.state, history.now)
        reference = undone.schedule(history.state, history.now)
        assert result.decisions == reference.decisions
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
    starts=st.lists(st.booleans(), min_size=50, max_size=50),
)
def test_a_planner_keeping_the_cycles_changes_decides_as_one_undoing_them(
    cluster: str, policy: SchedulingPolicy, ops: list[object], starts: list[bool]
) -> None:
    history = History(cluster, policy=policy)
    kept, undone = Planner(), Planner(undo_index=True)
    nodes = [view.node_id for view in history.state.nodes()]
    for number, op in enumerate(ops):
        if not perform(history, op, f"t{number:03d}", nodes) and isinstance(op, Wait):
            history.advance(op.seconds)
        _cycles_agree(history, kept, undone, starts[number % len(starts)])
