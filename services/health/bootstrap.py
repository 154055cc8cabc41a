"""Wires the health service from settings: store, metrics, telemetry consumer, log poll."""

from __future__ import annotations

import asyncio
import logging

from services.health.rules import HEALTH_PRODUCER
from services.health.service import HealthService
from services.health.settings import HealthSettings
from services.runtime.consumer import TelemetryConsumer, wait_started
from services.runtime.metrics import ConsumerLag, start_metrics_server
from services.runtime.store import EventStore

log = logging.getLogger(__name__)


async def run(settings: HealthSettings, stop: asyncio.Event) -> None:
    store = await EventStore.connect(settings, producer=HEALTH_PRODUCER)
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
