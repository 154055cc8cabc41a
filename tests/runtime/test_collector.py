"""The collector's settings of a started service (runtime/collector.py)."""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import Iterator

import pytest

from services.runtime.collector import (
    DEFERRED_YOUNG_THRESHOLD,
    FULL_COLLECTION_EVERY,
    collection_deferred,
    settle_started_service,
)


class _Node:
    def __init__(self) -> None:
        self.other: _Node | None = None


@pytest.fixture
def collector_restored() -> Iterator[None]:
    threshold = gc.get_threshold()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*threshold)


@pytest.mark.usefixtures("collector_restored")
def test_a_settled_service_collects_its_garbage_freezes_the_rest_and_rarely_scans_all() -> None:
    young, middle, _ = gc.get_threshold()
    gc.disable()  # the cycle below must still be there when the service settles
    try:
        a, b = _Node(), _Node()
        a.other, b.other = b, a
        dead = weakref.ref(a)
        del a, b
        alive = _Node()
        settle_started_service()
    finally:
        gc.enable()
    assert dead() is None  # collected, not frozen for the life of the process
    assert gc.get_freeze_count() > 0
    assert gc.isenabled()
    assert gc.get_threshold() == (young, middle, FULL_COLLECTION_EVERY)
    assert alive.other is None


@pytest.mark.usefixtures("collector_restored")
def test_a_deferred_scope_collects_the_young_generation_only_past_its_bound() -> None:
    gc.set_threshold(700, 10, 100)
    with collection_deferred():
        assert gc.get_threshold() == (DEFERRED_YOUNG_THRESHOLD, 10, 100)
        # Well past 700 tracked objects alive, well below the bound: no collection.
        collections = gc.get_stats()[0]["collections"]
        alive = [[index] for index in range(5_000)]
        assert gc.get_stats()[0]["collections"] == collections
    assert gc.get_threshold() == (700, 10, 100)
    assert len(alive) == 5_000


@pytest.mark.usefixtures("collector_restored")
async def test_overlapping_scopes_of_two_tasks_restore_the_threshold_when_the_last_closes() -> None:
    gc.set_threshold(700, 10, 100)
    first_open, second_open, first_closed = asyncio.Event(), asyncio.Event(), asyncio.Event()

    async def first() -> None:
        with collection_deferred():
            first_open.set()
            await second_open.wait()
        first_closed.set()

    async def second() -> tuple[int, int, int]:
        await first_open.wait()
        with collection_deferred():
            second_open.set()
            await first_closed.wait()
            return gc.get_threshold()

    _, during = await asyncio.gather(first(), second())
    assert during == (DEFERRED_YOUNG_THRESHOLD, 10, 100)  # the first closing left it raised
    assert gc.get_threshold() == (700, 10, 100)


@pytest.mark.usefixtures("collector_restored")
def test_a_scope_restores_the_threshold_after_an_error_and_leaves_a_collector_off_off() -> None:
    gc.set_threshold(700, 10, 100)
    with pytest.raises(RuntimeError), collection_deferred():
        raise RuntimeError("the batch failed")
    assert gc.get_threshold() == (700, 10, 100)
    gc.set_threshold(0, 10, 100)
    with collection_deferred():
        assert gc.get_threshold()[0] == 0
    assert gc.get_threshold() == (0, 10, 100)
