"""The placement snapshot's aggregates (nodes by free count per pool, free GPUs per rack, block,
pool and cluster, which racks and blocks have any) are kept up to date change by change, and
trials undo theirs: after any sequence of changes, inside and outside trials, the snapshot holds
exactly what a snapshot built fresh from the same free GPUs holds (core/placement.py)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from core.placement import Snapshot
from core.state import SchedulerState
from core.topology import parse_cluster_spec

CLUSTER = "6x8:2:2"  # 6 nodes of 8 GPUs, 2 nodes a rack, 2 racks a block: 2 blocks


def nodes() -> SchedulerState:
    state = SchedulerState()
    for node in parse_cluster_spec(CLUSTER):
        state.apply(node, 0.0)
    return state


def aggregates(snap: Snapshot) -> dict[str, object]:
    levels = snap.levels.items()
    return {
        "free": dict(snap.free),
        "count": dict(snap.count),
        "levels": {pool: [sorted(level) for level in by_count] for pool, by_count in levels},
        "rack_nodes": {rack: sorted(ids) for rack, ids in snap.rack_nodes.items() if ids},
        "rack_free": {rack: free for rack, free in snap.rack_free.items() if free},
        "block_racks": {block: sorted(ids) for block, ids in snap.block_racks.items() if ids},
        "block_free": {block: free for block, free in snap.block_free.items() if free},
        "pool_blocks": {pool: sorted(ids) for pool, ids in snap.pool_blocks.items() if ids},
        "pool_free": {pool: free for pool, free in snap.pool_free.items() if free},
        "total_free": snap.total_free,
    }


changes = st.lists(
    st.tuples(st.integers(min_value=0, max_value=5), st.integers(min_value=0, max_value=255)),
    max_size=30,
)


@given(before=changes, inside=changes, after=changes)
def test_a_snapshot_changed_node_by_node_holds_what_a_fresh_one_holds(
    before: list[tuple[int, int]], inside: list[tuple[int, int]], after: list[tuple[int, int]]
) -> None:
    state = nodes()
    records = state.node_records
    snap = Snapshot(records, state.free_masks)
    free = dict(state.free_masks)

    def change(steps: list[tuple[int, int]], into: dict[int, int]) -> None:
        for index, mask in steps:
            snap.set_free(index, mask)
            into[index] = mask

    change(before, free)
    with snap.trial():
        tried = dict(free)
        change(inside, tried)
        assert aggregates(snap) == aggregates(Snapshot(records, tried))
    assert aggregates(snap) == aggregates(Snapshot(records, free))
    change(after, free)

    assert aggregates(snap) == aggregates(Snapshot(records, free))


hosts = st.lists(
    st.tuples(
        st.integers(min_value=0, max_value=5),
        st.integers(min_value=-4_000, max_value=4_000),
        st.integers(min_value=-8_192, max_value=8_192),
    ),
    max_size=6,
)


@given(
    before=changes,
    outer=changes,
    wide=changes,
    nested=changes,
    shifts=hosts,
    after=changes,
    reserve=st.frozensets(st.integers(min_value=0, max_value=5)),
)
def test_a_wide_trial_puts_back_what_a_trial_would(
    before: list[tuple[int, int]],
    outer: list[tuple[int, int]],
    wide: list[tuple[int, int]],
    nested: list[tuple[int, int]],
    shifts: list[tuple[int, int, int]],
    after: list[tuple[int, int]],
    reserve: frozenset[int],
) -> None:
    """A wide trial (the head's reservation plan) copies the index and puts it back whole:
    inside, it answers as the changes say; on leaving, the index, its host ledger and its
    reserved nodes are as before, an enclosing trial still undoes its own changes, and a
    wide trial that changed anything counts as a change (answers kept by `changes` from
    inside it no longer hold)."""
    state = nodes()
    records = state.node_records
    snap = Snapshot(records, state.free_masks)
    free = dict(state.free_masks)

    def change(steps: list[tuple[int, int]], into: dict[int, int]) -> None:
        for index, mask in steps:
            snap.set_free(index, mask)
            into[index] = mask

    change(before, free)
    with snap.trial():
        tried = dict(free)
        change(outer, tried)
        host_before = dict(snap.host_taken)
        reserved_before = snap.reserved
        counted = snap.changes
        with snap.wide_trial() as planning:
            assert planning is snap
            inside = dict(tried)
            change(wide, inside)
            for index, cpus, memory in shifts:
                snap.shift_host(index, cpus, memory)
            snap.reserved = reserve
            with snap.trial():
                nested_free = dict(inside)
                change(nested, nested_free)
                assert aggregates(snap) == aggregates(Snapshot(records, nested_free))
            assert aggregates(snap) == aggregates(Snapshot(records, inside))
            changed_inside = snap.changes != counted
            seen_inside = snap.changes
        assert aggregates(snap) == aggregates(Snapshot(records, tried))
        assert snap.host_taken == host_before
        assert snap.reserved == reserved_before
        if changed_inside:
            assert snap.changes > seen_inside
        else:
            assert snap.changes == counted
        # Nodes changed only inside the wide trial were journaled nowhere: still put back.
        change(outer[:3], tried)
    assert aggregates(snap) == aggregates(Snapshot(records, free))
    change(after, free)
    assert aggregates(snap) == aggregates(Snapshot(records, free))


@given(
    steps=changes,
    reserve=st.frozensets(st.integers(min_value=0, max_value=5)),
    unit_gpus=st.sampled_from([1, 2, 4, 8]),
    avoid=st.booleans(),
    unit_host=st.sampled_from([(0, 0), (1_000, 0), (0, 4_096)]),
)
def test_a_racks_units_are_its_nodes_units(
    steps: list[tuple[int, int]],
    reserve: frozenset[int],
    unit_gpus: int,
    avoid: bool,
    unit_host: tuple[int, int],
) -> None:
    """`rack_units` reads free counts inline when no host ask is set: the same sum as asking
    each node (reserved nodes left out when avoided)."""
    state = nodes()
    snap = Snapshot(state.node_records, state.free_masks)
    for index, mask in steps:
        snap.set_free(index, mask)
    snap.reserved = reserve
    snap.unit_host = unit_host
    for rack, members in snap.rack_nodes.items():
        expected = sum(snap.node_units(i, unit_gpus, avoid) for i in members)
        assert snap.rack_units(rack, unit_gpus, avoid) == expected


@given(before=changes, inside=changes, ranks=st.integers(min_value=0, max_value=12))
def test_a_trial_for_releasing_ranks_puts_back_what_it_changed_whichever_it_is(
    before: list[tuple[int, int]], inside: list[tuple[int, int]], ranks: int
) -> None:
    """`trial_releasing` picks the wide trial when the ranks outnumber the nodes indexed, the
    node-by-node one otherwise: inside, the changes hold; after, nothing of them does."""
    state = nodes()
    records = state.node_records
    snap = Snapshot(records, state.free_masks)
    free = dict(state.free_masks)
    for index, mask in before:
        snap.set_free(index, mask)
        free[index] = mask
    with snap.trial_releasing(ranks):
        tried = dict(free)
        for index, mask in inside:
            snap.set_free(index, mask)
            tried[index] = mask
        assert aggregates(snap) == aggregates(Snapshot(records, tried))
    assert aggregates(snap) == aggregates(Snapshot(records, free))
