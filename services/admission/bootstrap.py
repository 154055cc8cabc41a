"""Wires admission from settings: store, metrics, the catalogue caught up, the consumer."""

from __future__ import annotations

import asyncio
import logging

import asyncpg
from prometheus_client import Counter

from core.policy import SchedulingPolicy
from schemas import EventEnvelope
from schemas.jobs import JobSubmitted
from services.admission.service import Admission
from services.admission.settings import AdmissionSettings
from services.runtime.collector import settle_started_service
from services.runtime.consumer import EventConsumer, wait_started
from services.runtime.metrics import ConsumerLag, new_registry, start_metrics_server
from services.runtime.signals import stop_on_signals
from services.runtime.startup import open_store
from services.runtime.topics import Topics

log = logging.getLogger("services.admission")


async def serve(settings: AdmissionSettings) -> int:
    stop = stop_on_signals()
    registry = new_registry()
    decided = Counter("gangway_admission_decisions", "Jobs admitted or rejected", registry=registry)
    consumer_lag = ConsumerLag("admission", registry)
    server = start_metrics_server(settings.metrics_port, registry)
    # Started while the database is away (a supervisor's restart during an outage): wait.
    store = await open_store(
        settings, producer=settings.service_name, log=log, stop=stop, migrate=True
    )
    if store is None:
        server.stop()
        return 0
    try:
        # The class names the scheduler knows are the ones a job may ask for.
        policy = SchedulingPolicy()
        admission = Admission(
            store,
            [pc.name for pc in policy.priority_classes],
            always_preemptible=(policy.idle_only_priority,),
        )
        await admission.catch_up()
        settle_started_service()

        async def handle(envelope: EventEnvelope, conn: asyncpg.Connection) -> None:
            await admission.on_submitted(envelope, conn)
            decided.inc()

        consumer = EventConsumer(
            settings,
            store.pool,
            name="admission",
            topics=[Topics.from_settings(settings).jobs],
            handlers={JobSubmitted.type: handle},
            # A fetched batch's decisions go to the log in one append (service.py `batch`).
            batch_scope=admission.batch,
            # The inbox makes a redelivered submission a no-op: offsets once a second, not
            # one round trip to the group coordinator per batch on the way to the next fetch.
            commit_interval_s=1.0,
        )
        consumer_lag.watch("events", consumer)
        task = asyncio.create_task(consumer.run(stop))
        await wait_started(consumer, task)
        log.info("admission ready")
        await task
        return 0
    finally:
        await store.close()
        server.stop()
