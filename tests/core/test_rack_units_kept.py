"""A rack's units (how many units of a size its free nodes hold, outside the reservation or
not) are kept between asks until one of its nodes changes (core/placement.py `rack_units`):
after any sequence of changes, asks, new reservations, trials and wide trials, every kept
answer is the one read from the rack's nodes (`rack_units_counted`)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from core.placement import Snapshot
from core.state import SchedulerState
from core.topology import parse_cluster_spec

CLUSTER = "8x8:2:2"  # 8 nodes of 8 GPUs, 2 nodes a rack, 2 racks a block
UNITS = (1, 2, 3, 4, 8)

Step = tuple[str, int, int]

steps = st.lists(
    st.one_of(
        st.tuples(st.just("set"), st.integers(0, 7), st.integers(0, 255)),
        st.tuples(st.just("ask"), st.integers(0, 3), st.sampled_from(UNITS)),
        st.tuples(st.just("reserve"), st.integers(0, 255), st.just(0)),
    ),
    max_size=25,
)


def snapshot() -> Snapshot:
    state = SchedulerState()
    for node in parse_cluster_spec(CLUSTER):
        state.apply(node, 0.0)
    return Snapshot(state.node_records, state.free_masks)


def run(snap: Snapshot, plan: list[Step]) -> None:
    for kind, first, second in plan:
        if kind == "set":
            snap.set_free(first, second)
        elif kind == "reserve":
            # A new reservation object (nodes picked by the bits of `first`), as reserve() sets.
            snap.reserved = frozenset(index for index in range(8) if first >> index & 1)
        elif first in snap.rack_nodes:
            for avoid in (False, True):
                assert snap.rack_units(first, second, avoid) == snap.rack_units_counted(
                    first, second, avoid
                )
        check(snap)


def check(snap: Snapshot) -> None:
    for rack in snap.rack_nodes:
        for unit in UNITS:
            for avoid in (False, True):
                kept = snap.rack_units(rack, unit, avoid)
                assert kept == snap.rack_units_counted(rack, unit, avoid), (rack, unit, avoid)


@given(before=steps, inside=steps, wide=steps, nested=steps, after=steps)
def test_kept_rack_units_are_those_read_from_the_racks_nodes(
    before: list[Step],
    inside: list[Step],
    wide: list[Step],
    nested: list[Step],
    after: list[Step],
) -> None:
    snap = snapshot()
    run(snap, before)
    with snap.trial():
        run(snap, inside)
        with snap.wide_trial():
            run(snap, wide)
            with snap.trial():
                run(snap, nested)
            check(snap)
        check(snap)
        run(snap, after)
    check(snap)
    run(snap, after)
    check(snap)


def test_a_racks_units_follow_a_change_of_one_of_its_nodes() -> None:
    """Built case: asked, then a node of the rack takes GPUs; the answer moves with it."""
    snap = snapshot()
    assert snap.rack_units(0, 4, False) == 4  # two whole nodes: 2 units of 4 each
    snap.set_free(0, 0b1111)
    assert snap.rack_units(0, 4, False) == 3
    snap.reserved = frozenset({1})
    assert snap.rack_units(0, 4, True) == 1
    snap.reserved = frozenset({0})
    assert snap.rack_units(0, 4, True) == 2
