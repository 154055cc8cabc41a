"""Reading the log by position: a team's audit page, whose positions its index gives."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from schemas.envelope import EventEnvelope
from services.runtime.records import RawEvent
from services.runtime.store import EventStore

_BY_POSITIONS = """
SELECT position, stream, version, event_id, type, schema_version, payload::text,
       correlation_id, causation_id, producer, epoch, recorded_at
FROM events
WHERE position = ANY($1::bigint[])
  AND ($2::text[] IS NULL OR type = ANY($2::text[]))
  AND ($3::text IS NULL OR stream = $3::text)
ORDER BY position
"""


async def read_positions(
    store: EventStore, positions: Sequence[int], types: Sequence[str], stream: str | None
) -> list[EventEnvelope]:
    """The events at `positions` (through the primary key), of `types` and `stream` if given."""
    async with store.connection() as conn:
        records = await conn.fetch(_BY_POSITIONS, list(positions), list(types) or None, stream)
    return [RawEvent(*record).decode(store.registry) for record in records]


@dataclass(slots=True)
class AuditGate:
    """At most `per_team` audit reads of one team in flight in this process; more wait.

    A team reading pages of a thousand events twenty at a time would otherwise hold the
    process's one event loop for everyone; waiting on its own gate, it holds only its share.
    """

    per_team: int
    _slots: dict[str, asyncio.Semaphore] = field(default_factory=dict)

    @asynccontextmanager
    async def slot(self, team: str) -> AsyncIterator[None]:
        semaphore = self._slots.get(team)
        if semaphore is None:
            semaphore = self._slots[team] = asyncio.Semaphore(self.per_team)
        async with semaphore:
            yield
