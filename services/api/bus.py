"""The read models' subscription to the bus, on the shared consumer runtime.

The API's effects are in memory and rebuilt from the log at every start, so it needs no inbox:
the read models' per-stream versions make a redelivered event a no-op.
"""

from __future__ import annotations

from aiokafka import ConsumerRecord

from schemas import EventDecodeError, EventEnvelope
from services.api.feed import ReadModelFeed
from services.runtime.consumer import ConsumerLoop, Outcome, Unprocessable, check_signature
from services.runtime.settings import Settings
from services.runtime.topics import Topics

# A commit only spares a restarted API re-reading, as no-ops, what it had applied (its read
# models are rebuilt from the log at start): once a second is enough, not one round trip to the
# group coordinator per batch (a twentieth of the API's CPU under a stream of submissions).
COMMIT_INTERVAL_S = 1.0


class ReadModelConsumer(ConsumerLoop):
    def __init__(self, settings: Settings, feed: ReadModelFeed, *, group: str) -> None:
        # Every log topic, so that the watermark (and thus the lag) advances from the bus alone.
        super().__init__(
            settings,
            name=group,
            topics=Topics.from_settings(settings).log_topics,
            commit_interval_s=COMMIT_INTERVAL_S,
        )
        self.feed = feed

    async def process(self, record: ConsumerRecord[bytes, bytes]) -> Outcome:
        # The API applies its own appends at once, and the log poll may have been first too:
        # an event the models hold already is left undecoded (the relay's header names its
        # position; skipping acts on nothing, so an unverified header can do no harm).
        position = _position(record)
        if position is not None and self.feed.models.watermark.covers(position):
            return Outcome.DUPLICATE
        if record.value is None:
            raise Unprocessable("message has no value")
        try:
            envelope = EventEnvelope.from_json(record.value)
        except EventDecodeError as error:
            raise Unprocessable(f"undecodable event: {error}") from error
        check_signature(record, envelope, self.settings)
        applied = await self.feed.deliver(envelope)
        return Outcome.APPLIED if applied else Outcome.DUPLICATE


def _position(record: ConsumerRecord[bytes, bytes]) -> int | None:
    for key, value in record.headers or ():
        if key == "position":
            try:
                return int(value)
            except ValueError:
                return None
    return None
