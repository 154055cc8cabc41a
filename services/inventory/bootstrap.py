"""Wires the inventory from settings: discovery, registration, liveness leadership."""

from __future__ import annotations

import asyncio
import logging
import os
import socket

from services.inventory.service import LIVENESS_LEADERSHIP, Inventory
from services.inventory.settings import InventorySettings
from services.runtime.consumer import TelemetryConsumer, wait_started
from services.runtime.discovery import discover
from services.runtime.leadership import acquire_leadership
from services.runtime.metrics import start_metrics_server
from services.runtime.store import EventStore

log = logging.getLogger(__name__)


async def run(settings: InventorySettings, stop: asyncio.Event) -> None:
    discovered = discover(
        settings.cluster,
        mode=settings.discovery,
        node_id=settings.node_id,
        rack=settings.node_rack,
        block=settings.node_block,
        labels=settings.node_labels,
    )
    store = await EventStore.connect(settings, producer="inventory")
    try:
        inventory = Inventory(settings, store)
        if settings.metrics_port is not None:
            start_metrics_server(settings.metrics_port, inventory.registry)
        added = await inventory.register(discovered)
        log.info(
            "%d nodes discovered (%s), %d registrations appended",
            len(discovered),
            discovered[0].discovered_by if discovered else "none",
            added,
        )
        # Every host's inventory registers its own node; one of them, the leader, judges the
        # liveness of all (one consumer of every heartbeat, one writer of NodeLost).
        leader_id = f"inventory-{socket.gethostname()}-{os.getpid()}"
        log.info("inventory ready; %s waits to lead liveness", leader_id)
        leadership = await acquire_leadership(
            store, settings.pg_dsn, leader_id, name=LIVENESS_LEADERSHIP, stop=stop
        )
        if leadership is None:
            return
        try:
            inventory.restart_clock()
            await inventory.follow_log()
            consumer = TelemetryConsumer(settings, name="inventory", handler=inventory.on_telemetry)
            consume = asyncio.create_task(consumer.run(stop))
            check = asyncio.create_task(inventory.check_forever(stop, leadership))
            await wait_started(consumer, consume)
            log.info("inventory leads liveness (epoch %d)", leadership.epoch)
            await asyncio.gather(consume, check)
        finally:
            await leadership.release()
    finally:
        await store.close()
