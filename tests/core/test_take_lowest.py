"""A rank bound on a node takes its lowest free GPUs (core/placement.py `take_lowest`): read at
once when they lie side by side from the lowest, the answer must be the one taken bit by bit,
for any free GPUs and any count, more than are free included."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from core.placement import take_lowest, take_lowest_one_by_one


@given(mask=st.integers(min_value=0, max_value=(1 << 16) - 1), count=st.integers(0, 17))
def test_the_lowest_gpus_read_at_once_are_those_taken_one_by_one(mask: int, count: int) -> None:
    assert take_lowest(mask, count) == take_lowest_one_by_one(mask, count)


def test_gpus_not_side_by_side_are_taken_lowest_first() -> None:
    assert take_lowest(0b1011_0110, 3) == 0b0001_0110
    assert take_lowest(0b1111_0000, 2) == 0b0011_0000
    assert take_lowest(0b0000_0101, 4) == 0b0000_0101
