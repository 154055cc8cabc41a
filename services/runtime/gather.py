"""How long a stage gathers work before its next round: nothing when idle, a little when busy.

A stage woken per append (the relay) pays for each round: a query, a Kafka request (and so a
fetch and a batch for every consumer behind it), a wake-up of its process. Under a stream of
single submissions every round carries a few events, and those per-round costs, not the
events, are most of the pipeline's CPU. After a round that carried many records the next one
waits a few milliseconds before it starts, so that it carries more; after a quiet round it
starts at once, so an idle cluster's submit-to-reserved latency is untouched; after a round
large enough to spread its costs (a burst of batches, a stage that fell behind) it starts at
once too: the backlog gathers by itself. (The scheduler does not use it: it is the stage
behind in a burst of batches, where a wait of its own was lost throughput.)
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class GatherPolicy:
    """`busy_records`: a round of at least this many records was busy; `enough_records`: a
    round of at least this many needs no gathering; `max_wait_s`: the longest a round waits
    after a busy one (0: never waits). Between the two the wait grows with the round's size,
    from a quarter of `max_wait_s` at `busy_records` to all of it at four times that."""

    busy_records: int = 8
    enough_records: int = 128
    max_wait_s: float = 0.020

    def __post_init__(self) -> None:
        if self.busy_records < 1:
            raise ValueError("busy_records must be at least 1")
        if self.enough_records <= self.busy_records:
            raise ValueError("enough_records must be more than busy_records")
        if self.max_wait_s < 0:
            raise ValueError("max_wait_s must not be negative")

    def wait_after(self, records: int) -> float:
        """Seconds to wait before the round after one that carried `records` records."""
        if not self.busy_records <= records < self.enough_records or self.max_wait_s == 0:
            return 0.0
        return self.max_wait_s * min(1.0, records / (4 * self.busy_records))
