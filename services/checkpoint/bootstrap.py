"""Wires the checkpoint service from settings: store, metrics, consumer, periodic requests,
the retention sweep."""

from __future__ import annotations

import asyncio
import logging

from services.checkpoint.service import CheckpointService
from services.checkpoint.settings import CheckpointSettings
from services.runtime.consumer import EventConsumer, wait_started
from services.runtime.metrics import start_metrics_server
from services.runtime.startup import open_store
from services.runtime.store import EventStore
from services.runtime.topics import Topics

log = logging.getLogger(__name__)


def consumer_of(
    settings: CheckpointSettings, store: EventStore, service: CheckpointService
) -> EventConsumer:
    """The service's consumer of the log, its lag reported on the service's metrics."""
    topics = Topics.from_settings(settings)
    consumer = EventConsumer(
        settings,
        store.pool,
        name="checkpoint",
        topics=[topics.jobs, topics.checkpoints],
        handlers=service.handlers(),
    )
    service.metrics.consumer_lag.watch("events", consumer)
    return consumer


async def run(settings: CheckpointSettings, stop: asyncio.Event) -> None:
    # Started while the database is away (a supervisor's restart during an outage): wait.
    store = await open_store(settings, producer="checkpoint", log=log, stop=stop)
    if store is None:
        return
    service = CheckpointService(settings, store)
    try:
        await asyncio.to_thread(service.root.mkdir, parents=True, exist_ok=True)
        if settings.metrics_port is not None:
            start_metrics_server(settings.metrics_port, service.registry)
        consumer = consumer_of(settings, store, service)
        await service.rebuild_periodic()
        resumed = await service.resume_pending()
        if resumed:
            log.info("collecting %d checkpoints requested before the restart", resumed)
        consume = asyncio.create_task(consumer.run(stop))
        periodic = asyncio.create_task(service.request_forever(stop))
        sweeping = asyncio.create_task(service.sweep_forever(stop))
        await wait_started(consumer, consume)
        log.info("checkpoint ready (root %s)", service.root)
        await asyncio.gather(consume, periodic, sweeping)
    finally:
        await service.drain()
        await store.close()
