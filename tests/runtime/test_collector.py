"""The collector's settings of a started service (runtime/collector.py)."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from services.runtime.collector import FULL_COLLECTION_EVERY, settle_started_service


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
