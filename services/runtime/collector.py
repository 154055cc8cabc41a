"""The cyclic garbage collector, paused around work that allocates much and makes no cycles,
and kept off what a long-running service built at start-up.

A scheduling cycle, a replay, a snapshot's pickling: each allocates many objects over a large,
long-lived heap and makes little or no cyclic garbage, so the collector's repeated scans of that
heap cost more than the work itself (measured: over half of replay time). The pure core never
touches the collector; its long-running callers (the scheduler service, the simulator) do.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """No cyclic collection inside; the collector is left as it was found."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


# Full collections in a started service: at most one per this many collections of the middle
# generation (CPython's default is 10; it also waits until the objects that survived since the
# last full one are a quarter of those it scanned then).
FULL_COLLECTION_EVERY = 100


def settle_started_service() -> None:
    """Once a long-running service has started (its modules imported, its state rebuilt):
    collect what start-up left, move every live object to the permanent generation, which no
    collection scans again, and make full collections rare.

    Measured in a burst of 10,000 batch submissions (bench_pipeline.py, gc callbacks): the
    full collections, each a scan of the whole heap of tens of milliseconds, were 0.17 to 0.52
    s of CPU per process of admission, the scheduler and the API, and 16 to 18% of their CPU
    with the young collections. Garbage in cycles that outlives the young generations waits
    longer for its collection; the young generations are collected as before."""
    gc.collect()
    gc.freeze()
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(young, middle, FULL_COLLECTION_EVERY)


# While a batch is processed, the young generation is collected once this many more tracked
# objects are alive than at its last collection, instead of every 700: a bound, so that a batch
# stalled on the network (or many overlapping) still has its cyclic garbage collected.
DEFERRED_YOUNG_THRESHOLD = 100_000


class _Deferral:
    """How many `collection_deferred` scopes are open in the process (they overlap across an
    event loop's tasks), and the young threshold to restore when the last one closes."""

    open = 0
    young = 0


@contextlib.contextmanager
def collection_deferred() -> Iterator[None]:
    """The young collections deferred to the end of a batch (a consumer's fetched batch),
    when its transient objects are gone.

    Measured in a burst of 10,000 batch submissions (bench_pipeline.py, gc callbacks): a batch
    keeps its records and envelopes alive until it ends, and every young collection inside it
    scanned them, then the middle generation scanned them again, for nothing: 0.13 s of
    admission's 1.09 s of CPU (0.03 s with the scope). Scopes may overlap across an event
    loop's tasks: the threshold is raised when the first opens and restored when the last
    closes. Nothing is collected less: what is garbage at the end of the batch is collected by
    the next collection, as it would have been by a later one."""
    if _Deferral.open == 0:
        young, middle, full = gc.get_threshold()
        _Deferral.young = young
        # 0 switches the collector off: left so.
        gc.set_threshold(young and max(young, DEFERRED_YOUNG_THRESHOLD), middle, full)
    _Deferral.open += 1
    try:
        yield
    finally:
        _Deferral.open -= 1
        if _Deferral.open == 0:
            _, middle, full = gc.get_threshold()
            gc.set_threshold(_Deferral.young, middle, full)
