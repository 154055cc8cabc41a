"""An event as the relay publishes it: the envelope's JSON, byte for byte as json.dumps has it."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone
from uuid import UUID, uuid4

import pytest

from services.runtime.records import RawEvent


def _reference(raw: RawEvent) -> bytes:
    head = json.dumps(
        {
            "event_id": str(raw.event_id),
            "stream": raw.stream,
            "version": raw.version,
            "position": raw.position,
            "type": raw.type,
            "schema_version": raw.schema_version,
            "recorded_at": raw.recorded_at.isoformat(),
            "correlation_id": None if raw.correlation_id is None else str(raw.correlation_id),
            "causation_id": None if raw.causation_id is None else str(raw.causation_id),
            "producer": raw.producer,
            "epoch": raw.epoch,
        },
        separators=(",", ":"),
    )
    return f'{head[:-1]},"payload":{raw.payload}}}'.encode()


@pytest.mark.parametrize(
    ("stream", "producer", "correlation", "causation", "epoch", "at"),
    [
        ("job-1", "api", None, None, None, datetime(2026, 11, 23, 10, 0, tzinfo=UTC)),
        ('job-"quoted"\\', "sched\u00e9duler-\u2603", uuid4(), uuid4(), 7, datetime.now(UTC)),
        ("node-\n\t\x00", "a\u0001b", uuid4(), None, 0, datetime(2026, 1, 1, 0, 0, 0, 1, UTC)),
        ("team-\U0001f680", "", None, uuid4(), 2**40, datetime.now(timezone(timedelta(hours=-5)))),
    ],
)
def test_the_published_envelope_is_json_dumps_byte_for_byte(
    stream: str,
    producer: str,
    correlation: UUID | None,
    causation: UUID | None,
    epoch: int | None,
    at: datetime,
) -> None:
    payload = '{"job_id":"j-1","note":"caf\\u00e9 \\"x\\""}'
    raw = RawEvent(41, stream, 3, uuid4(), "JobSubmitted", 2, payload, correlation, causation,
                   producer, epoch, at)  # fmt: skip
    published = raw.to_json()
    assert published == _reference(raw)
    decoded = json.loads(published)
    assert decoded["stream"] == stream
    assert decoded["producer"] == producer
    assert decoded["epoch"] == epoch
    assert decoded["payload"] == json.loads(payload)
