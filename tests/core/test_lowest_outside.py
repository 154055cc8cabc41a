"""Best fit on one node takes the lowest node of the fullest level that has room, outside the
head's reservation when the gang must avoid it (core/placement.py): read without building the
level less the reserved nodes when its lowest node is not reserved, the answer must be the
lowest of that difference, or none when it is empty."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from core.placement import Snapshot, _lowest_outside, find_placement, shape_of
from core.state import NodeRecord
from schemas.jobs import JobSpec

nodes = st.sets(st.integers(min_value=0, max_value=40), min_size=1, max_size=30)


@given(level=nodes, reserved=st.frozensets(st.integers(min_value=0, max_value=40), max_size=30))
def test_the_lowest_node_outside_the_reservation_is_the_lowest_of_the_difference(
    level: set[int], reserved: frozenset[int]
) -> None:
    assert _lowest_outside(level, reserved) == min(level - reserved, default=None)
    assert _lowest_outside(level, frozenset()) == min(level)


def _node(index: int, cpus_milli: int) -> NodeRecord:
    return NodeRecord(
        index=index,
        node_id=f"n{index}",
        hostname=f"n{index}",
        gpu_type="H100",
        rack="r0",
        block="b0",
        gpu_count=8,
        all_mask=0xFF,
        labels={},
        cpus_milli=cpus_milli,
        memory_mb=1_000_000,
    )


def test_a_gang_whose_host_ask_only_a_reserved_node_holds_avoids_that_node() -> None:
    """The lowest free node outside the reservation has the GPUs but not the CPUs: the node
    that has both is reserved, so a gang behind the head fits nowhere (and one placed for the
    head's own plan takes it)."""
    snap = Snapshot([_node(0, 2_000), _node(1, 64_000)], {0: 0xFF, 1: 0xFF})
    snap.reserved = frozenset({1})
    shape = shape_of(JobSpec(name="x", team="t", gpus_per_task=1, cpus_per_task=4.0))

    assert find_placement(snap, shape, True) is None
    assert find_placement(snap, shape, False) == [(1, 1)]
