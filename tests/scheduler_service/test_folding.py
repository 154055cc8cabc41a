"""Folding stored events into the scheduler's state: strictly in position order, exactly."""

from __future__ import annotations

from datetime import UTC, datetime
from uuid import uuid4

import pytest

from core.policy import SchedulingPolicy
from core.topology import parse_cluster_spec
from schemas import EventDecodeError, EventEnvelope
from schemas.base import Event
from schemas.teams import TeamCreated
from services.runtime.records import RawEvent
from services.scheduler.folding import Folded, LogGap

AT = datetime(2026, 1, 1, tzinfo=UTC)


def raw(position: int, event: Event, *, version: int = 1, payload: str | None = None) -> RawEvent:
    return RawEvent(
        position=position,
        stream=event.stream,
        version=version,
        event_id=uuid4(),
        type=event.type,
        schema_version=event.schema_version,
        payload=event.model_dump_json() if payload is None else payload,
        correlation_id=None,
        causation_id=None,
        producer="tests",
        epoch=None,
        recorded_at=AT,
    )


def team(name: str) -> TeamCreated:
    return TeamCreated(name=name, guaranteed_gpus=8, max_gpus=None, token_sha256="0" * 64)


def test_stored_events_are_folded_with_their_stream_versions_and_position() -> None:
    folded = Folded.empty(SchedulingPolicy())
    [node] = parse_cluster_spec("1x8")
    folded.fold_raw([raw(1, node), raw(2, team("a")), raw(3, team("b"), version=4)])
    assert folded.position == 3
    assert folded.versions == {node.stream: 1, "team-a": 1, "team-b": 4}
    assert folded.state.total_gpus == 8


def test_an_event_out_of_position_order_is_refused_and_nothing_after_it_is_folded() -> None:
    folded = Folded.empty(SchedulingPolicy())
    with pytest.raises(LogGap):
        folded.fold_raw([raw(1, team("a")), raw(3, team("b"))])
    assert folded.position == 1
    assert "team-b" not in folded.versions


def test_an_undecodable_payload_stops_the_batch_at_the_last_folded_position() -> None:
    folded = Folded.empty(SchedulingPolicy())
    broken = raw(2, team("b"), payload='{"name": "b"}')
    with pytest.raises(EventDecodeError):
        folded.fold_raw([raw(1, team("a")), broken, raw(3, team("c"))])
    assert folded.position == 1
    assert set(folded.versions) == {"team-a"}


def _envelope(stored: RawEvent, event: Event) -> EventEnvelope:
    return EventEnvelope(
        event_id=stored.event_id,
        stream=stored.stream,
        version=stored.version,
        position=stored.position,
        type=stored.type,
        schema_version=stored.schema_version,
        payload=event,
        recorded_at=stored.recorded_at,
        producer=stored.producer,
    )


def test_an_event_given_decoded_with_its_position_and_id_is_folded_as_given_not_decoded() -> None:
    # The scheduler's own decisions, read back from the log after others' events: their
    # stored JSON is not decoded again (here it is not JSON at all, so a decode would fail).
    [node] = parse_cluster_spec("1x8")
    stored = raw(2, team("b"), payload="not json")
    decoded = {2: _envelope(stored, team("b"))}
    folded = Folded.empty(SchedulingPolicy())
    folded.fold_raw([raw(1, node), stored, raw(3, team("c"))], decoded=decoded)
    assert folded.position == 3
    assert folded.versions == {node.stream: 1, "team-b": 1, "team-c": 1}
    assert folded.state.total_gpus == 8


def test_an_event_given_decoded_under_another_id_is_decoded_from_the_log() -> None:
    stored = raw(1, team("b"), payload="not json")
    elsewhere = _envelope(raw(1, team("b")), team("b"))  # same position, another event id
    folded = Folded.empty(SchedulingPolicy())
    with pytest.raises(EventDecodeError):
        folded.fold_raw([stored], decoded={1: elsewhere})
    assert folded.position == 0
