"""Keeps the read models in step with the log: rebuild at start, then events as they come.

Events come from the bus (fast, ordered per stream only) and from the API's own appends
(read-your-writes). The log is the authority behind both: a stream gap is filled from it, and
`catch_up` reads it by position, which is how the models are rebuilt at start and how they
never stay behind when the relay or the bus lags.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable

from schemas.envelope import EventEnvelope
from services.api.projections.model import Outcome, ReadModels
from services.runtime.store import EventStore

log = logging.getLogger(__name__)

CATCH_UP_BATCH = 5000


class ReadModelFeed:
    def __init__(self, store: EventStore, models: ReadModels) -> None:
        self.store = store
        self.models = models
        self.head = 0
        # One `reach_head` reads the log at a time: the reads that arrive while a worker lags
        # wait for it instead of each reading the same thousands of events.
        self._reaching = asyncio.Lock()
        # One look at the log's head at a time, shared by every read that arrived before it
        # began (`_head_now`): a flood of one team's reads costs a query per round trip, not a
        # pooled connection each, which starved every other team's reads and writes.
        self._looking = asyncio.Lock()
        self._looks_begun = 0
        self._looked = (0, 0)  # (the number of the last look that answered, its head)

    @property
    def lag(self) -> int:
        """Events committed to the log (as of the last look at its head) not yet applied."""
        return max(0, self.head - self.models.watermark.position)

    async def catch_up(self) -> int:
        """Apply everything the log holds beyond the watermark; return how many were applied."""
        applied = 0
        watermark = self.models.watermark
        registry = self.store.registry
        while True:
            batch = await self.store.read_all_raw(watermark.position, CATCH_UP_BATCH)
            for raw in batch:
                # What the bus delivered out of order is applied already: left undecoded.
                if not watermark.covers(raw.position):
                    applied += await self.deliver(raw.decode(registry))
            if len(batch) < CATCH_UP_BATCH:
                break
        self.head = max(self.head, self.models.watermark.position)
        return applied

    async def reach_head(self) -> int:
        """Apply everything committed to the log up to now (one query when nothing is missing):
        after it, the models hold every write acknowledged before the call, whichever API
        worker made it. Returns how many events were applied."""
        head = await self._head_now()
        self.head = max(self.head, head)
        if head <= self.models.watermark.position:
            return 0
        async with self._reaching:
            if head <= self.models.watermark.position:
                return 0  # the read before this one brought it
            return await self.catch_up()

    async def _head_now(self) -> int:
        """The log's head as of a look begun after this call: what it answers holds every
        event committed before the call. A look already under way may have begun before a
        write the caller was told of, so the calls that arrive during it wait and share the
        next one (a look that failed answers nobody else: the next waiter looks again)."""
        arrived = self._looks_begun
        async with self._looking:
            number, head = self._looked
            if number > arrived:
                return head
            self._looks_begun += 1
            number = self._looks_begun
            head = await self.store.head()
            self._looked = (number, head)
            return head

    async def refresh_head(self) -> int:
        self.head = await self.store.head()
        return self.head

    async def deliver(self, envelope: EventEnvelope) -> int:
        """Apply one event; on a gap in its stream, first read the missing ones from the log."""
        outcome = self.models.apply(envelope)
        if outcome is Outcome.GAP:
            return await self.sync_stream(envelope.stream)
        return 1 if outcome is Outcome.APPLIED else 0

    async def deliver_all(self, envelopes: Iterable[EventEnvelope]) -> int:
        return sum([await self.deliver(envelope) for envelope in envelopes])

    async def sync_stream(self, stream: str) -> int:
        """Bring one stream up to date with the log (before a command decides on it)."""
        missing = await self.store.read_stream(stream, self.models.version_of(stream))
        outcomes = self.models.apply_all(missing)
        return sum(1 for outcome in outcomes if outcome is Outcome.APPLIED)
