"""Histories as the log would record them: envelopes with stream versions and positions."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import uuid4

from schemas.base import Event
from schemas.envelope import EventEnvelope
from schemas.jobs import GangReserved, JobSpec, JobSubmitted, RankPlacement
from schemas.nodes import GpuInfo, NodeRegistered

T0 = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)


class Log:
    """Records events the way the store does: gap-free positions, per-stream versions."""

    def __init__(self) -> None:
        self.envelopes: list[EventEnvelope] = []
        self._versions: dict[str, int] = {}

    def record(self, *events: Event) -> list[EventEnvelope]:
        recorded = []
        for event in events:
            version = self._versions.get(event.stream, 0) + 1
            self._versions[event.stream] = version
            position = len(self.envelopes) + 1
            envelope = EventEnvelope(
                event_id=uuid4(),
                stream=event.stream,
                version=version,
                position=position,
                type=event.type,
                schema_version=event.schema_version,
                payload=event,
                recorded_at=T0 + timedelta(seconds=position),
                producer="tests",
            )
            self.envelopes.append(envelope)
            recorded.append(envelope)
        return recorded


def spec(team: str = "nlp", *, tasks: int = 2, gpus_per_task: int = 4, **fields: object) -> JobSpec:
    return JobSpec.model_validate(
        {"name": "train", "team": team, "tasks": tasks, "gpus_per_task": gpus_per_task, **fields}
    )


def submitted(job_id: str, team: str = "nlp", **fields: Any) -> JobSubmitted:
    return JobSubmitted(job_id=job_id, spec=spec(team, **fields), submitted_by=f"team:{team}")


def node(node_id: str, *, gpus: int = 8, rack: str = "r1", block: str = "b1") -> NodeRegistered:
    return NodeRegistered(
        node_id=node_id,
        hostname=node_id,
        gpu_type="H100",
        gpus=[
            GpuInfo(index=i, uuid=f"{node_id}-{i}", model="H100", memory_mb=81920)
            for i in range(gpus)
        ],
        rack=rack,
        block=block,
        discovered_by="spec",
    )


def reserved(
    job_id: str, placement: Iterable[tuple[str, list[int]]], attempt: int = 1
) -> GangReserved:
    return GangReserved(
        job_id=job_id,
        attempt=attempt,
        ranks=[
            RankPlacement(rank=rank, node_id=node_id, gpus=gpus)
            for rank, (node_id, gpus) in enumerate(placement)
        ],
    )
