"""Wires the health service from settings: store, metrics, telemetry consumer, log poll."""

from __future__ import annotations

import asyncio
import logging

from services.health.rules import HEALTH_PRODUCER
from services.health.service import HealthService
from services.health.settings import HealthSettings
from services.runtime.consumer import TelemetryConsumer, wait_started
from services.runtime.metrics import ConsumerLag, start_metrics_server
from services.runtime.startup import open_store

log = logging.getLogger(__name__)


async def run(settings: HealthSettings, stop: asyncio.Event) -> None:
    # Started while the database is away (a supervisor's restart during an outage): wait.
    store = await open_store(settings, producer=HEALTH_PRODUCER, log=log, stop=stop)
    if store is None:
        return
    try:
        service = HealthService(settings, store)
        if settings.metrics_port is not None:
            start_metrics_server(settings.metrics_port, service.registry)
        await service.follow_log()
        consumer = TelemetryConsumer(settings, name="health", handler=service.on_telemetry)
        ConsumerLag("health", service.registry).watch("telemetry", consumer)
        consume = asyncio.create_task(consumer.run(stop))
        poll = asyncio.create_task(service.poll_log(stop))
        await wait_started(consumer, consume)
        log.info("health ready")
        await asyncio.gather(consume, poll)
    finally:
        await store.close()
