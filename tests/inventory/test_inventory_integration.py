"""The inventory against the real log: registration once, loss and recovery recorded once."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest

from schemas.telemetry import NodeHeartbeat
from services.inventory.bootstrap import run
from services.inventory.service import BusProbe, Inventory
from services.inventory.settings import InventorySettings
from services.runtime import EventStore, Settings
from services.runtime.discovery import load_cluster_spec
from tests.integration.conftest import settings, stack, store

pytestmark = pytest.mark.integration
__all__ = ["settings", "stack", "store"]

FLEET = load_cluster_spec("3x8")


def inventory(settings: Settings, store: EventStore, timeout_s: float = 60.0) -> Inventory:
    return Inventory(
        InventorySettings(
            **{**settings.model_dump(), "heartbeat_timeout_s": timeout_s, "startup_grace_s": 0},
            _env_file=None,
        ),
        store,
    )


async def types_in(store: EventStore, stream: str) -> list[str]:
    return [envelope.type for envelope in await store.read_stream(stream)]


async def changes_until(inv: Inventory, want: int) -> list[str]:
    """Run liveness checks until `want` changes were made; their node ids."""
    found: list[str] = []
    async with asyncio.timeout(30):
        while len(found) < want:
            found += [change.node_id for change in await inv.check()]
            await asyncio.sleep(0.05)
    return found


async def test_registering_the_same_fleet_twice_records_each_node_once(
    settings: Settings, store: EventStore
) -> None:
    assert await inventory(settings, store).register(FLEET) == 3
    assert await inventory(settings, store).register(FLEET) == 0
    registered = await store.read_all(0, 100, types=["NodeRegistered"])
    assert sorted(e.stream for e in registered) == ["node-n0000", "node-n0001", "node-n0002"]


async def test_a_silent_node_is_lost_and_recovers_when_heard_again(
    settings: Settings, store: EventStore
) -> None:
    inv = inventory(settings, store, timeout_s=0.3)
    await inv.register(FLEET[:1])
    assert await changes_until(inv, 1) == ["n0000"]
    assert await types_in(store, "node-n0000") == ["NodeRegistered", "NodeLost"]
    await inv.on_telemetry(NodeHeartbeat(node_id="n0000", at=datetime.now(UTC)))
    assert await changes_until(inv, 1) == ["n0000"]
    assert await types_in(store, "node-n0000") == ["NodeRegistered", "NodeLost", "NodeRecovered"]


async def test_a_restarted_inventory_does_not_lose_a_lost_node_again(
    settings: Settings, store: EventStore
) -> None:
    first = inventory(settings, store, timeout_s=0.3)
    await first.register(FLEET[:1])
    await changes_until(first, 1)
    second = inventory(settings, store, timeout_s=0.3)
    await second.register(FLEET[:1])
    await asyncio.sleep(0.6)  # longer than the timeout: a fresh tracker would declare it lost
    assert await second.check() == []
    assert await types_in(store, "node-n0000") == ["NodeRegistered", "NodeLost"]


async def liveness_epoch(store: EventStore) -> int:
    async with store.pool.acquire() as conn:
        epoch = await conn.fetchval("SELECT epoch FROM leader_epochs WHERE name = 'inventory'")
    return 0 if epoch is None else int(epoch)


async def test_one_inventory_judges_liveness_and_a_standby_takes_over(
    settings: Settings, store: EventStore
) -> None:
    config = InventorySettings(
        **{**settings.model_dump(), "cluster": "2x8", "discovery": "spec"}, _env_file=None
    )
    stops = [asyncio.Event(), asyncio.Event()]
    first = asyncio.create_task(run(config, stops[0]))

    async def epoch_reaches(epoch: int) -> None:
        async with asyncio.timeout(30):
            while True:
                if await liveness_epoch(store) >= epoch:
                    return
                await asyncio.sleep(0.05)

    await epoch_reaches(1)
    second = asyncio.create_task(run(config, stops[1]))
    await asyncio.sleep(1.0)  # the standby would have taken over by now if it could
    assert await liveness_epoch(store) == 1
    stops[0].set()
    await first
    await epoch_reaches(2)
    stops[1].set()
    await second
    registered = await store.read_all(0, 100, types=["NodeRegistered"])
    assert len(registered) == 2


async def test_an_inventory_cut_off_from_the_bus_declares_no_node_lost(
    settings: Settings, store: EventStore
) -> None:
    inv = inventory(settings, store, timeout_s=0.3)
    await inv.register(FLEET)
    await asyncio.sleep(0.6)  # every node is past the timeout, but nobody could be heard
    assert await inv.check(bus_connected=False) == []
    for node in FLEET:
        assert await types_in(store, node.stream) == ["NodeRegistered"]


async def test_the_bus_probe_says_down_when_no_broker_answers(settings: Settings) -> None:
    nowhere = InventorySettings(
        **{**settings.model_dump(), "kafka_bootstrap": "127.0.0.1:9", "bus_probe_timeout_s": 1},
        _env_file=None,
    )
    probe = BusProbe(nowhere)
    try:
        assert await probe.connected() is False
    finally:
        await probe.close()
    here = BusProbe(InventorySettings(**settings.model_dump(), _env_file=None))
    try:
        assert await here.connected() is True
    finally:
        await here.close()


async def test_the_liveness_leader_competes_again_when_its_lock_session_is_killed(
    settings: Settings, store: EventStore
) -> None:
    config = InventorySettings(
        **{**settings.model_dump(), "cluster": "2x8", "discovery": "spec"}, _env_file=None
    )
    stop = asyncio.Event()
    task = asyncio.create_task(run(config, stop))

    async def epoch_reaches(epoch: int) -> None:
        async with asyncio.timeout(30):
            while True:
                if await liveness_epoch(store) >= epoch:
                    return
                await asyncio.sleep(0.05)

    await epoch_reaches(1)
    async with store.pool.acquire() as conn:
        # As a database restart does to every session: the lock goes with it.
        killed = await conn.fetchval(
            """SELECT count(pg_terminate_backend(pid)) FROM pg_locks
               WHERE locktype = 'advisory' AND granted
                 AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"""
        )
    assert killed == 1
    await epoch_reaches(2)
    assert not task.done()
    stop.set()
    await task
