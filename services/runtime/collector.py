"""The cyclic garbage collector, paused around work that allocates much and makes no cycles.

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
