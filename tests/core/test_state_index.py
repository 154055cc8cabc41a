"""The indexes a planner keeps between cycles (core/state_index.py: the order book of the
waiting jobs, the holding gangs' timers) watch the state they index, and only it: one watch
while they index a state, none left behind once they index another or are gone themselves,
and never a state kept alive by them. They are built again, with a fresh watch, when the
state's policy is replaced or the clock goes back, and kept (the same watch, drained) when
neither happened."""

from __future__ import annotations

import gc
import weakref
from dataclasses import replace

import pytest

from core.ordering import OrderBook
from core.state import HoldingWatch, WaitingWatch
from core.timers import GangTimers
from tests.core.builders import History, a_job

Kind = type[OrderBook] | type[GangTimers]
Watch = WaitingWatch | HoldingWatch


class Indexed:
    """A state with waiting jobs and holding gangs, and the watches its history's own
    planner took of it (left out of what the tests count)."""

    def __init__(self) -> None:
        self.history = history = History("2x8:2:1")
        history.submit(a_job().gpus(1), a_job().gpus(2).tasks(2))
        history.cycle()
        history.submit(a_job().gpus(1))
        self.state = state = history.state
        assert state.holding_jobs and state.waiting_jobs
        self.planners = {id(watch) for watch in [*state._waiting_watches, *state._holding_watches]}

    def watches(self, kind: Kind) -> list[Watch]:
        """The state's watches of the kind the index keeps itself up to date with."""
        state = self.state
        watches: list[Watch] = [
            *(state._waiting_watches if kind is OrderBook else state._holding_watches)
        ]
        return [watch for watch in watches if id(watch) not in self.planners]


@pytest.fixture(params=[OrderBook, GangTimers], ids=["order book", "timers"])
def kind(request: pytest.FixtureRequest) -> Kind:
    made: Kind = request.param
    return made


def test_an_index_watches_the_state_it_indexes_once(kind: Kind) -> None:
    indexed = Indexed()
    index, now = kind(), indexed.history.now
    index._sync(indexed.state, now)
    (watch,) = indexed.watches(kind)
    index._sync(indexed.state, now)
    indexed.history.submit(a_job().gpus(1))
    index._sync(indexed.state, now + 1)
    # Kept: the same watch, told of the new job and drained by the index.
    assert indexed.watches(kind) == [watch]
    assert not (watch.changed if isinstance(watch, WaitingWatch) else watch.changes)


def test_an_index_that_moves_to_another_state_leaves_no_watch_on_the_first(kind: Kind) -> None:
    first, second = Indexed(), Indexed()
    index = kind()
    index._sync(first.state, first.history.now)
    index._sync(second.state, second.history.now)
    assert first.watches(kind) == []
    assert len(second.watches(kind)) == 1
    # And back: one watch again, the second state's dropped.
    index._sync(first.state, first.history.now)
    assert len(first.watches(kind)) == 1
    assert second.watches(kind) == []


def test_an_index_gone_leaves_no_watch_on_its_state(kind: Kind) -> None:
    indexed = Indexed()
    index = kind()
    index._sync(indexed.state, indexed.history.now)
    assert len(indexed.watches(kind)) == 1
    del index
    gc.collect()
    assert indexed.watches(kind) == []


def test_an_index_never_keeps_its_state_alive(kind: Kind) -> None:
    indexed = Indexed()
    state = weakref.ref(indexed.state)
    index = kind()
    index._sync(indexed.state, indexed.history.now)
    del indexed
    gc.collect()
    assert state() is None
    # The index, asked about a new state, builds from it as from any other.
    other = Indexed()
    index._sync(other.state, other.history.now)
    assert len(other.watches(kind)) == 1


@pytest.mark.parametrize("change", ["policy replaced", "clock went back"])
def test_an_index_is_built_again_when_the_policy_is_replaced_or_the_clock_goes_back(
    kind: Kind, change: str
) -> None:
    indexed = Indexed()
    index, now = kind(), indexed.history.now
    index._sync(indexed.state, now)
    (before,) = indexed.watches(kind)
    if change == "policy replaced":
        # Equal in every field, but another object: the index cannot know it is the same.
        indexed.state.policy = replace(indexed.state.policy)
    else:
        now -= 1
    index._sync(indexed.state, now)
    (after,) = indexed.watches(kind)
    assert after is not before


def test_an_index_is_kept_while_the_clock_stands_or_goes_on(kind: Kind) -> None:
    indexed = Indexed()
    index, now = kind(), indexed.history.now
    index._sync(indexed.state, now)
    (watch,) = indexed.watches(kind)
    for later in (now, now + 10, now + 10, now + 3600):
        index._sync(indexed.state, later)
        assert indexed.watches(kind) == [watch]


def test_the_waiting_watch_notes_jobs_in_the_order_first_noted() -> None:
    # The order book sorts a burst's arrivals by submission: noted in arrival order, they
    # come nearly sorted (about one comparison each), where a set's order cost a burst of
    # ~9,400 some 2 ms of a cycle's sorting.
    history = History("1x8:1:1")
    watch = history.state.watch_waiting()
    arrivals = history.submit(*(a_job().gpus(8) for _ in range(40)))
    first = arrivals[0]
    history.suspend(first)  # noted again: it keeps its first place

    assert list(watch.changed) == arrivals
