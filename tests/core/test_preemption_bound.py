"""The victim search passes over victims that could not make room even all evicted together
(core/preemption.py `search_victims`, `_units_at_most`): the bound it judges by is never below
the whole units the shape would really find with every victim gone, so no eviction that would
have made the preemptor fit is ever passed over."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from core.host import release_gang
from core.placement import Snapshot
from core.preemption import _fits, _free_units, _on_node, _units_at_most, search_victims
from tests.core.builders import History, a_job

NODES = 4
GPUS = 8


@st.composite
def layouts(draw: st.DrawFn) -> list[tuple[int, int]]:
    """(node, GPUs) of each running gang, no node over its 8 GPUs."""
    gangs = []
    for node in range(NODES):
        left = GPUS
        for _ in range(draw(st.integers(0, 4))):
            if left == 0:
                break
            size = draw(st.integers(1, left))
            gangs.append((node, size))
            left -= size
    return gangs


@settings(max_examples=150, deadline=None)
@given(
    gangs=layouts(),
    victim_picks=st.lists(st.booleans(), min_size=16, max_size=16),
    unit=st.sampled_from([1, 2, 4, 8]),
    units=st.integers(1, 6),
)
def test_the_bound_is_never_below_the_units_found_with_every_victim_gone(
    gangs: list[tuple[int, int]], victim_picks: list[bool], unit: int, units: int
) -> None:
    history = History(f"{NODES}x{GPUS}:2:1")
    running = [history.occupy(f"n{node:04d}", size) for node, size in gangs]
    waiting = history.submit(a_job().gpus(unit).tasks(units))[0]
    state = history.state
    shape = state.job_records[waiting].shape
    assert shape is not None
    victims = [
        state.job_records[job] for job, picked in zip(running, victim_picks, strict=False) if picked
    ]
    snap = Snapshot(state.node_records, state.free_masks)
    bound = _units_at_most(snap, shape, _on_node(victims))
    with snap.trial():
        for victim in victims:
            release_gang(snap, victim)
        found = _free_units(snap, shape)
    assert bound >= found
    if bound < shape.min_units:
        assert _fits(snap, shape, victims) is None
        assert search_victims(snap, shape, victims) is None
