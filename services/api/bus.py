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


class ReadModelConsumer(ConsumerLoop):
    def __init__(self, settings: Settings, feed: ReadModelFeed, *, group: str) -> None:
        # Every log topic, so that the watermark (and thus the lag) advances from the bus alone.
        super().__init__(settings, name=group, topics=Topics.from_settings(settings).log_topics)
        self.feed = feed

    async def process(self, record: ConsumerRecord[bytes, bytes]) -> Outcome:
        if record.value is None:
            raise Unprocessable("message has no value")
        try:
            envelope = EventEnvelope.from_json(record.value)
        except EventDecodeError as error:
            raise Unprocessable(f"undecodable event: {error}") from error
        check_signature(record, envelope, self.settings)
        applied = await self.feed.deliver(envelope)
        return Outcome.APPLIED if applied else Outcome.DUPLICATE
