"""Telemetry speaks only for the agents: a heartbeat or sample produced onto the telemetry
topic by anyone else is dead-lettered, never judged.

The agents sign every heartbeat and step-time sample (services/runtime/consumer.py
`telemetry_record`, the services' key); the inventory and the health monitor read the topic
through the one TelemetryConsumer, which acts on no other record. Here the forgeries are
produced as the broker's admin (on scripts/stack.sh's broker nobody else but an agent could
write the topic at all: tests/security/test_bus_acls.py): one unsigned, one signed with a
guessed key. Beside them a genuine, signed record of another node shows that the same record,
signed, does act.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

import pytest
from aiokafka import AIOKafkaProducer

from schemas.telemetry import GpuSample, NodeHeartbeat
from services.health.service import HealthService
from services.health.settings import HealthSettings
from services.inventory.service import Inventory
from services.inventory.settings import InventorySettings
from services.runtime import EventStore, Settings, Topics
from services.runtime.consumer import TelemetryConsumer, TelemetryMessage, publish_telemetry
from services.runtime.discovery import load_cluster_spec
from services.runtime.kafka import make_producer
from services.runtime.signing import signed
from services.runtime.topics import ensure_topics
from tests.integration.support import header, read_topics, running, wait_until

pytestmark = pytest.mark.integration


async def _forge(settings: Settings, topics: Topics, message: TelemetryMessage) -> None:
    """Produce `message` twice: unsigned, and signed with a guessed key."""
    value = message.model_dump_json().encode()
    producer: AIOKafkaProducer = make_producer(settings)
    await producer.start()
    try:
        key = message.node_id.encode()
        await producer.send_and_wait(topics.telemetry, value, key=key)
        await producer.send_and_wait(
            topics.telemetry, value, key=key, headers=signed([], value, b"a guessed key")
        )
    finally:
        await producer.stop()


async def _genuine(settings: Settings, topics: Topics, message: TelemetryMessage) -> None:
    producer = make_producer(settings)
    await producer.start()
    try:
        await publish_telemetry(producer, topics, message, key=settings.bus_signing_key)
    finally:
        await producer.stop()


async def _both_refused(settings: Settings, topics: Topics) -> None:
    dead = await read_topics(settings, [topics.deadletter], 2)
    reasons = [header(record, "deadletter.reason") or "" for record in dead]
    assert all("telemetry refused" in reason for reason in reasons), reasons


async def _types(store: EventStore, node: str) -> list[str]:
    return [envelope.type for envelope in await store.read_stream(f"node-{node}")]


def _xid_79(node: str) -> NodeHeartbeat:
    return NodeHeartbeat(
        node_id=node, at=datetime.now(UTC), gpus=[GpuSample(index=1, xid_errors=[79])]
    )


async def test_a_forged_gpu_failure_drains_nothing(
    settings: Settings, store: EventStore, topics: Topics
) -> None:
    await ensure_topics(settings)
    health = HealthService(HealthSettings(**settings.model_dump(), _env_file=None), store)
    consumer = TelemetryConsumer(settings, name="health", handler=health.on_telemetry)
    async with running(consumer):
        await _forge(settings, topics, _xid_79("n1"))
        await _genuine(settings, topics, _xid_79("n2"))

        async def genuine_judged() -> bool:
            return "NodeDrainRequested" in await _types(store, "n2")

        await wait_until(genuine_judged, what="the signed XID 79 drained its node")
        await _both_refused(settings, topics)
    assert await _types(store, "n1") == []


async def test_a_forged_heartbeat_does_not_revive_a_lost_node(
    settings: Settings, store: EventStore, topics: Topics
) -> None:
    await ensure_topics(settings)
    inventory = Inventory(
        InventorySettings(
            **{**settings.model_dump(), "heartbeat_timeout_s": 0.3, "startup_grace_s": 0},
            _env_file=None,
        ),
        store,
    )
    await inventory.register(load_cluster_spec("2x8"))

    async def lost(node: str) -> Callable[[], Awaitable[bool]]:
        async def check() -> bool:
            await inventory.check()
            return (await _types(store, node))[-1:] == ["NodeLost"]

        return check

    for node in ("n0000", "n0001"):
        await wait_until(await lost(node), what=f"{node} lost")

    consumer = TelemetryConsumer(settings, name="inventory", handler=inventory.on_telemetry)
    async with running(consumer):
        await _forge(settings, topics, NodeHeartbeat(node_id="n0000", at=datetime.now(UTC)))
        await _genuine(settings, topics, NodeHeartbeat(node_id="n0001", at=datetime.now(UTC)))

        async def genuine_heard() -> bool:
            await inventory.check()
            # (and lost again 0.3 s later: it sends no more)
            return "NodeRecovered" in await _types(store, "n0001")

        await wait_until(genuine_heard, what="the signed heartbeat revived n0001")
        await _both_refused(settings, topics)
        # Judged again after the forgeries were read: still lost, never recovered.
        await inventory.check()
    assert await _types(store, "n0000") == ["NodeRegistered", "NodeLost"]
