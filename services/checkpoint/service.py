"""The checkpoint service: gathers every rank's shard of a requested checkpoint, verifies it,
and records CheckpointCommitted or CheckpointCorrupted.

A checkpoint is requested by CheckpointRequested or implied by PreemptionRequested; its id is
derived from that event (store.checkpoint_id_for), so the agents write their shards where the
service looks without a word between them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import asyncpg
from prometheus_client import Counter

from schemas.checkpoints import (
    CheckpointCommitted,
    CheckpointCorrupted,
    CheckpointRequested,
)
from schemas.envelope import EventEnvelope
from schemas.jobs import GangReserved, PreemptionRequested
from services.checkpoint.settings import CheckpointSettings
from services.checkpoint.store import (
    Verification,
    checkpoint_dir,
    checkpoint_id_for,
    reported_ranks,
    verify,
    write_manifest,
)
from services.runtime.consumer import EventConsumer, EventHandler, wait_started
from services.runtime.metrics import new_registry, start_metrics_server
from services.runtime.records import Metadata
from services.runtime.store import EventStore
from services.runtime.topics import Topics

log = logging.getLogger(__name__)


def outcome(
    job_id: str, attempt: int, checkpoint_id: str, verification: Verification
) -> CheckpointCommitted | CheckpointCorrupted:
    if verification.ok:
        return CheckpointCommitted(
            job_id=job_id,
            attempt=attempt,
            checkpoint_id=checkpoint_id,
            step=verification.step,
            shards=verification.shards,
        )
    return CheckpointCorrupted(
        job_id=job_id, checkpoint_id=checkpoint_id, reason="; ".join(verification.problems)
    )


class CheckpointService:
    def __init__(self, settings: CheckpointSettings, store: EventStore) -> None:
        self.settings = settings
        self.store = store
        self.root = settings.checkpoint_root.resolve()
        self._tasks: set[asyncio.Task[Any]] = set()
        self.registry = new_registry()
        self.outcomes = Counter(
            "gangway_checkpoint_outcomes", "Checkpoints by outcome", ["outcome"],
            registry=self.registry,
        )

    def handlers(self) -> dict[str, EventHandler]:
        return {
            "CheckpointRequested": self.on_request,
            "PreemptionRequested": self.on_request,
        }

    async def on_request(self, envelope: EventEnvelope, conn: asyncpg.Connection) -> None:
        event = envelope.payload
        assert isinstance(event, CheckpointRequested | PreemptionRequested)
        if isinstance(event, PreemptionRequested):
            wait_s = event.grace_s + self.settings.collect_slack_s
        else:
            wait_s = self.settings.checkpoint_timeout_s
        # Gathering takes up to the grace period: it runs beside the consumer, not in it.
        task = asyncio.create_task(
            self.collect(event.job_id, event.attempt, envelope, wait_s)
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def world_size(self, job_id: str, attempt: int) -> int | None:
        for envelope in reversed(await self.store.read_stream(f"job-{job_id}")):
            event = envelope.payload
            if isinstance(event, GangReserved) and event.attempt == attempt:
                return len(event.ranks)
        return None

    async def collect(
        self, job_id: str, attempt: int, cause: EventEnvelope, wait_s: float
    ) -> CheckpointCommitted | CheckpointCorrupted | None:
        checkpoint_id = checkpoint_id_for(attempt, cause.event_id)
        world = await self.world_size(job_id, attempt)
        if world is None:
            log.warning("checkpoint %s of %s: attempt %d never had a gang", checkpoint_id,
                        job_id, attempt)
            return None
        directory = checkpoint_dir(self.root, job_id, checkpoint_id)
        deadline = time.monotonic() + wait_s
        while len(await asyncio.to_thread(reported_ranks, directory, world)) < world:
            if time.monotonic() > deadline:
                break
            await asyncio.sleep(self.settings.poll_interval_s)
        if not await asyncio.to_thread(reported_ranks, directory, world):
            # Nothing was written (the ranks were gone before the request): nothing to judge.
            log.warning("checkpoint %s of %s: no shard written", checkpoint_id, job_id)
            self.outcomes.labels("empty").inc()
            return None
        verification = await asyncio.to_thread(verify, directory, world)
        result = outcome(job_id, attempt, checkpoint_id, verification)
        if isinstance(result, CheckpointCommitted):
            await asyncio.to_thread(
                write_manifest, directory, job_id=job_id, attempt=attempt,
                checkpoint_id=checkpoint_id, verification=verification,
            )
        if await self._already_recorded(result.stream, checkpoint_id):
            return result
        await self.store.append(result.stream, None, [result], Metadata.caused_by(cause))
        self.outcomes.labels(result.type).inc()
        log.info("%s %s of job %s", result.type, checkpoint_id, job_id)
        return result

    async def _already_recorded(self, stream: str, checkpoint_id: str) -> bool:
        """A redelivered request finds its outcome already in the log."""
        for envelope in await self.store.read_stream(stream):
            event = envelope.payload
            if isinstance(event, CheckpointCommitted | CheckpointCorrupted) and (
                event.checkpoint_id == checkpoint_id
            ):
                return True
        return False

    async def drain(self) -> None:
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=5)


async def run(settings: CheckpointSettings, stop: asyncio.Event) -> None:
    store = await EventStore.connect(settings, producer="checkpoint")
    service = CheckpointService(settings, store)
    try:
        await asyncio.to_thread(service.root.mkdir, parents=True, exist_ok=True)
        if settings.metrics_port is not None:
            start_metrics_server(settings.metrics_port, service.registry)
        topics = Topics.from_settings(settings)
        consumer = EventConsumer(
            settings, store.pool, name="checkpoint",
            topics=[topics.jobs, topics.checkpoints], handlers=service.handlers(),
        )
        consume = asyncio.create_task(consumer.run(stop))
        await wait_started(consumer, consume)
        log.info("checkpoint ready (root %s)", service.root)
        await consume
    finally:
        await service.drain()
        await store.close()
