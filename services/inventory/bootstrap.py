"""Wires the inventory from settings: discovery, registration, liveness leadership."""

from __future__ import annotations

import asyncio
import logging
import os
import socket

from aiokafka.errors import KafkaError

from services.inventory.service import LIVENESS_LEADERSHIP, BusProbe, Inventory
from services.inventory.settings import InventorySettings
from services.runtime.consumer import TelemetryConsumer
from services.runtime.discovery import discover
from services.runtime.errors import DATABASE_UNAVAILABLE
from services.runtime.leadership import Leadership, compete
from services.runtime.metrics import ConsumerLag, start_metrics_server
from services.runtime.retry import Outage, until_available
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
    database = Outage(log, "inventory: the event log")
    store = await until_available(
        lambda: EventStore.connect(settings, producer="inventory"),
        database,
        stop,
        transient=DATABASE_UNAVAILABLE,
    )
    if store is None:
        return
    try:
        inventory = Inventory(settings, store)
        consumer_lag = ConsumerLag("inventory", inventory.registry)
        if settings.metrics_port is not None:
            start_metrics_server(settings.metrics_port, inventory.registry)
        added = await until_available(
            lambda: inventory.register(discovered), database, stop, transient=DATABASE_UNAVAILABLE
        )
        if added is None:
            return
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
        while not stop.is_set():
            leadership = await compete(
                store, settings.pg_dsn, leader_id, name=LIVENESS_LEADERSHIP, stop=stop
            )
            if leadership is None:
                return
            try:
                await _lead(inventory, leadership, settings, stop, consumer_lag)
            finally:
                inventory.leadership = None
                await leadership.release()
    finally:
        await store.close()


async def _lead(
    inventory: Inventory,
    leadership: Leadership,
    settings: InventorySettings,
    stop: asyncio.Event,
    consumer_lag: ConsumerLag,
) -> None:
    """Judge liveness until `stop` is set or the leadership is lost (then return)."""
    inventory.restart_clock()
    await until_available(
        inventory.follow_log,
        Outage(log, "inventory: the event log"),
        stop,
        transient=DATABASE_UNAVAILABLE,
    )
    inventory.leadership = leadership
    # Its own stop: losing the leadership ends this term's consumer, not the process.
    term = asyncio.Event()
    consumer = TelemetryConsumer(settings, name="inventory", handler=inventory.on_telemetry)
    consumer_lag.watch("telemetry", consumer)
    consume = asyncio.create_task(_consume(consumer, term))
    probe = BusProbe(settings)
    check = asyncio.create_task(inventory.check_forever(stop, leadership, probe))
    stopped = asyncio.create_task(stop.wait())
    # Judging starts at once (blind while the bus is away); "leads" once heartbeats flow.
    started = asyncio.create_task(consumer.started.wait())
    try:
        await asyncio.wait({started, check, stopped}, return_when=asyncio.FIRST_COMPLETED)
        if started.done():
            log.info("inventory leads liveness (epoch %d)", leadership.epoch)
            await asyncio.wait({check, stopped}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        term.set()
        for task in (stopped, started, check):
            task.cancel()  # a check mid-append is rolled back whole; the next term decides
        await asyncio.gather(check, consume, return_exceptions=True)
        await probe.close()


async def _consume(consumer: TelemetryConsumer, stop: asyncio.Event) -> None:
    """The heartbeat consumer, started again (from the committed offsets) whenever it fails:
    a broker that is away at start, or a client that gave up, ends no process."""
    outage = Outage(log, "inventory: the telemetry bus")
    while not stop.is_set():
        try:
            # Running again: whether the bus answers is the consumer loop's own readiness
            # (its Outage), so this one must not hold /readyz down while the loop runs.
            outage.recovered()
            await consumer.run(stop)
            return
        except (KafkaError, OSError, TimeoutError) as error:
            if await outage.sleep(error, stop):
                return
