"""Reading the log by position: a team's audit page, whose positions its index gives."""

from __future__ import annotations

from collections.abc import Sequence

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
