"""What an index kept between cycles by a planner (core/ordering.py `OrderBook`, core/timers.py
`GangTimers`) holds of the state it indexes, and the one rule for when it must be built again.

Such an index is built from one state and kept up to date from one of that state's watches
(core/state.py). It is built again when it is asked about another state (or about one for the
first time), when the state has a new policy (the index rests on the policy it was built
under), or when the clock went back (what had come by the latest moment asked about, a job
aged or a gang past its estimate, may not have come yet). It holds the state weakly, so it
never keeps a state alive, and the watch is dropped from the state when the index is built
again or goes itself (a planner dropped while its state lives on), so a state's watches are
only those of the indexes kept of it.
"""

from __future__ import annotations

import math
import weakref
from bisect import bisect_left
from collections.abc import Callable, Hashable, Mapping
from operator import itemgetter
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from core.policy import SchedulingPolicy
from core.state import EndWatch, HoldingWatch, WaitingWatch
from core.surface import PlanningSurface

__all__ = ["StateIndex"]

W = TypeVar("W", EndWatch, HoldingWatch, WaitingWatch)

if TYPE_CHECKING:
    # Drops the watch from the state (if it still lives) when the index goes.
    _Finalizer = weakref.finalize[
        [weakref.ref[PlanningSurface], Callable[[PlanningSurface, W], None], W], "StateIndex[W]"
    ]


def _unwatch(
    state_ref: weakref.ref[PlanningSurface],
    unwatch: Callable[[PlanningSurface, W], None],
    watch: W,
) -> None:
    state = state_ref()
    if state is not None:
        unwatch(state, watch)


class StateIndex(Generic[W]):
    """The state an index was built from (weakly), the watch that keeps it up to date, the
    policy it was built under and the latest moment it was asked about."""

    __slots__ = ("__weakref__", "_finalizer", "_latest_now", "_policy", "_state", "_watch")

    def __init__(self) -> None:
        self._state: weakref.ref[PlanningSurface] | None = None
        self._watch: W | None = None
        self._finalizer: _Finalizer[W] | None = None
        # No state's policy: until `_bind`, only the policy an index is built under by default.
        self._policy = SchedulingPolicy()
        self._latest_now = -math.inf

    def _current(self, state: PlanningSurface, now: float) -> W | None:
        """The watch that keeps the index up to date if it still stands for `state` at `now`;
        None when it must be built again (and bound, `_bind`): another state or none yet, a new
        policy, or the clock went back. Either way `now` is the latest moment asked about."""
        indexed = self._state() if self._state is not None else None
        watch = self._watch
        latest, self._latest_now = self._latest_now, now
        if indexed is not state or state.policy is not self._policy or now < latest:
            return None
        return watch

    def _bind(
        self, state: PlanningSurface, watch: W, unwatch: Callable[[PlanningSurface, W], None]
    ) -> None:
        """The index is built again from `state`, under its policy, and kept up to date by
        `watch` (just taken from it) from now on; `unwatch` drops a watch from a state. The
        watch it had before is dropped from its state now, this one when the index goes."""
        if self._finalizer is not None:
            self._finalizer()
        self._state = state_ref = weakref.ref(state)
        self._watch = watch
        self._finalizer = weakref.finalize(self, _unwatch, state_ref, unwatch, watch)
        self._policy = state.policy


_first = itemgetter(0)
_Name = TypeVar("_Name", bound=Hashable)
_Entry = TypeVar("_Entry", bound=tuple[Any, ...])


def merge_sorted(groups: dict[_Name, list[_Entry]], fresh: Mapping[_Name, list[_Entry]]) -> None:
    """Merge each group's newcomers (`fresh`, any order) into the kept group, sorted by
    their first element (unique within a group): a few by bisection, a burst by one sort
    of the two runs (Python's sort merges runs in C)."""
    for name, entries in fresh.items():
        group = groups.get(name)
        if group is None:
            group = groups[name] = []
        if len(entries) < 8:
            for entry in entries:
                group.insert(bisect_left(group, entry[:1]), entry)
        else:
            group.extend(entries)
            group.sort(key=_first)
