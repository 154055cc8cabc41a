"""The event catalogue: stable names, frozen facts, old payloads that keep loading."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest
from pydantic import ValidationError

from schemas import REGISTRY, EventDecodeError, EventEnvelope
from schemas.jobs import JobSpec, TopologySpec
from tests.schemas.examples import EXAMPLES

FIXTURES = Path(__file__).parent.parent / "fixtures" / "events"

# Names the design brief promises; the log and the bus carry exactly these strings.
DESIGN_EVENT_TYPES = {
    "JobSubmitted", "JobCancelRequested", "QueueConfigured", "TeamCreated", "JobAdmitted",
    "JobRejected", "GangReserved", "PreemptionRequested", "JobRequeued", "ReservationPlanned",
    "NodeRegistered", "NodeLost", "NodeRecovered", "NodeDegraded", "NodeDrainRequested",
    "NodeDrained", "GpuUnhealthy", "StragglerDetected", "CheckpointCommitted",
    "CheckpointCorrupted", "TaskStarted", "TaskExited", "JobSucceeded", "JobFailed",
    "LeaderElected",
}  # fmt: skip


def test_every_event_type_named_in_the_design_is_registered() -> None:
    assert set(REGISTRY.types) >= DESIGN_EVENT_TYPES


def test_event_type_names_do_not_follow_class_renames() -> None:
    for type_name in REGISTRY.types:
        assert "type" in REGISTRY.model(type_name).__dict__, f"{type_name} inherits its name"


def test_events_are_frozen() -> None:
    event = EXAMPLES["JobAdmitted"]
    with pytest.raises(ValidationError):
        event.queue = "other"  # type: ignore[attr-defined]


@pytest.mark.parametrize("fixture", sorted(FIXTURES.glob("*.json")), ids=lambda p: p.stem)
def test_stored_payloads_of_every_version_keep_loading(fixture: Path) -> None:
    type_name, version = fixture.stem.rsplit(".v", 1)
    event = REGISTRY.decode(type_name, int(version), fixture.read_text())
    assert event.type == type_name


def test_every_registered_type_has_a_stored_fixture() -> None:
    stored = {path.stem.rsplit(".v", 1)[0] for path in FIXTURES.glob("*.json")}
    assert stored == set(REGISTRY.types)


@pytest.mark.parametrize("type_name", sorted(EXAMPLES))
def test_an_event_survives_the_envelope_round_trip(type_name: str) -> None:
    event = EXAMPLES[type_name]
    envelope = EventEnvelope(
        event_id=uuid.uuid4(),
        stream=event.stream,
        version=1,
        position=42,
        type=event.type,
        schema_version=event.schema_version,
        payload=event,
        recorded_at=datetime(2026, 11, 21, tzinfo=UTC),
        producer="test",
        epoch=7,
    )
    assert EventEnvelope.from_json(envelope.to_json()) == envelope


def test_events_name_their_streams_by_aggregate() -> None:
    assert EXAMPLES["GangReserved"].stream == "job-j1"
    assert EXAMPLES["NodeLost"].stream == "node-n0000"
    assert EXAMPLES["TeamCreated"].stream == "team-nlp"
    assert EXAMPLES["CheckpointCommitted"].stream == "checkpoint-j1"
    assert EXAMPLES["LeaderElected"].stream == "scheduler"


def test_an_unknown_type_is_a_decode_error() -> None:
    with pytest.raises(EventDecodeError, match="unknown event type"):
        REGISTRY.decode("JobTeleported", 1, {})


def test_a_payload_from_a_newer_schema_version_is_a_decode_error() -> None:
    with pytest.raises(EventDecodeError, match="newer than this code"):
        REGISTRY.decode("JobAdmitted", 99, {"job_id": "j1", "queue": "q", "priority": "p"})


def test_an_invalid_payload_is_a_decode_error() -> None:
    with pytest.raises(EventDecodeError, match="invalid GangReserved"):
        REGISTRY.decode("GangReserved", 1, {"job_id": "j1", "attempt": 0, "ranks": []})


@pytest.mark.parametrize(
    "raw",
    [b"not json", b"[1, 2]", b'{"type": "JobAdmitted"}', b'{"type": "X", "schema_version": 1, '
     b'"payload": {}}', b'{"type": "JobAdmitted", "schema_version": 1, "payload": "x"}'],
)  # fmt: skip
def test_a_malformed_bus_message_is_a_decode_error(raw: bytes) -> None:
    with pytest.raises(EventDecodeError):
        EventEnvelope.from_json(raw)


def test_min_tasks_above_tasks_is_refused() -> None:
    with pytest.raises(ValidationError, match="min_tasks"):
        JobSpec(name="a", team="t", tasks=2, min_tasks=3)


def test_tp_size_must_align_with_gpus_per_task() -> None:
    with pytest.raises(ValidationError, match="tp_size"):
        JobSpec(name="a", team="t", tasks=2, gpus_per_task=6, topology=TopologySpec(tp_size=4))


def test_a_tp_group_may_span_several_single_gpu_ranks() -> None:
    spec = JobSpec(name="a", team="t", tasks=16, gpus_per_task=1, topology=TopologySpec(tp_size=8))
    assert spec.total_gpus == 16


def test_job_spec_rejects_unknown_fields() -> None:
    with pytest.raises(ValidationError, match="extra"):
        JobSpec.model_validate({"name": "a", "team": "t", "gpus": 8})


def test_stored_fixtures_are_what_the_examples_encode() -> None:
    for type_name, event in EXAMPLES.items():
        stored = json.loads((FIXTURES / f"{type_name}.v{event.schema_version}.json").read_text())
        assert REGISTRY.decode(type_name, event.schema_version, stored) == event
