"""The health service against the real log: facts recorded once, even across a restart."""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime, timedelta

import pytest

from schemas.nodes import NodeDrainRequested, NodeUndrained
from schemas.telemetry import GpuSample, NodeHeartbeat, StepTimeSample
from services.health.service import HealthService
from services.health.settings import HealthSettings
from services.runtime import EventStore, Settings
from tests.integration.conftest import settings, stack, store

pytestmark = pytest.mark.integration
__all__ = ["settings", "stack", "store"]


def service(settings: Settings, store: EventStore) -> HealthService:
    return HealthService(HealthSettings(**settings.model_dump(), _env_file=None), store)


def xid_79(node: str = "n1", at: datetime | None = None) -> NodeHeartbeat:
    return NodeHeartbeat(
        node_id=node,
        at=at or datetime.now(UTC),
        gpus=[GpuSample(index=0, temperature_c=50), GpuSample(index=1, xid_errors=[79])],
    )


async def node_types(store: EventStore, node: str = "n1") -> list[str]:
    return [envelope.type for envelope in await store.read_stream(f"node-{node}")]


async def test_a_fallen_gpu_is_recorded_once_in_its_node_stream(
    settings: Settings, store: EventStore
) -> None:
    health = service(settings, store)
    await health.on_telemetry(xid_79())
    await health.on_telemetry(xid_79())
    assert await node_types(store) == ["GpuUnhealthy", "NodeDegraded", "NodeDrainRequested"]


async def test_a_restarted_service_does_not_record_the_same_failure_again(
    settings: Settings, store: EventStore
) -> None:
    await service(settings, store).on_telemetry(xid_79())
    restarted = service(settings, store)
    await restarted.follow_log()
    await restarted.on_telemetry(xid_79())
    assert await node_types(store) == ["GpuUnhealthy", "NodeDegraded", "NodeDrainRequested"]


async def test_an_undrained_node_can_be_drained_again(
    settings: Settings, store: EventStore
) -> None:
    health = service(settings, store)
    await health.on_telemetry(xid_79())
    await store.append("node-n1", None, [NodeUndrained(node_id="n1", by="operator")])
    await health.follow_log()
    await health.on_telemetry(xid_79())
    assert (await node_types(store)).count("NodeDrainRequested") == 2


async def test_a_stale_sample_is_not_judged(settings: Settings, store: EventStore) -> None:
    old = datetime.now(UTC) - timedelta(hours=1)
    await service(settings, store).on_telemetry(xid_79(at=old))
    assert await node_types(store) == []


async def test_a_straggling_rank_is_recorded_on_its_node(
    settings: Settings, store: EventStore
) -> None:
    health = service(settings, store)
    now = datetime.now(UTC)
    for step in range(8):
        for rank, pace in ((0, 1.0), (1, 1.0), (2, 4.0)):
            await health.on_telemetry(
                StepTimeSample(
                    job_id="j",
                    attempt=1,
                    rank=rank,
                    node_id=f"n{rank}",
                    step=step,
                    step_time_s=pace,
                    at=now,
                )
            )
    assert await node_types(store, "n2") == ["StragglerDetected", "NodeDegraded"]
    assert await node_types(store, "n0") == []


def healthy(node: str = "n1") -> NodeHeartbeat:
    return NodeHeartbeat(
        node_id=node,
        at=datetime.now(UTC),
        gpus=[GpuSample(index=0, temperature_c=50), GpuSample(index=1, temperature_c=50)],
    )


async def test_a_node_drained_for_a_fault_returns_once_the_fault_clears_even_after_a_restart(
    settings: Settings, store: EventStore
) -> None:
    await service(settings, store).on_telemetry(xid_79())
    restarted = HealthService(
        HealthSettings(**settings.model_dump(), recovery_samples=2, _env_file=None), store
    )
    await restarted.follow_log()
    for _ in range(3):
        await restarted.on_telemetry(healthy())
    assert (await node_types(store))[3:] == ["GpuRecovered", "NodeUndrained"]
    [undrained] = [e.payload for e in await store.read_stream("node-n1")][-1:]
    assert isinstance(undrained, NodeUndrained) and undrained.by == "health"


async def test_a_node_an_operator_drained_is_not_returned_by_health(
    settings: Settings, store: EventStore
) -> None:
    health = HealthService(
        HealthSettings(**settings.model_dump(), recovery_samples=1, _env_file=None), store
    )
    await health.on_telemetry(xid_79())
    await store.append(
        "node-n1", None, [NodeDrainRequested(node_id="n1", reason="rewiring", by="admin")]
    )
    await health.follow_log()
    await health.on_telemetry(healthy())
    await health.on_telemetry(healthy())
    assert "NodeUndrained" not in await node_types(store)


async def test_a_database_away_is_one_line_when_lost_not_a_traceback_at_every_poll(
    settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    away = await EventStore.connect(settings, producer="tests")
    await away.close()  # every read now fails as a pool the database went away from does
    health = HealthService(
        HealthSettings(**{**settings.model_dump(), "log_poll_interval_s": 0.01}, _env_file=None),
        away,
    )
    stop = asyncio.Event()
    caplog.set_level(logging.WARNING, logger="services.health.service")
    polling = asyncio.create_task(health.poll_log(stop))
    await asyncio.sleep(0.3)  # some thirty polls
    stop.set()
    await polling

    records = [r for r in caplog.records if r.name == "services.health.service"]
    [lost] = records
    assert lost.getMessage().startswith("health: the event log lost: ")
    assert lost.exc_info is None
