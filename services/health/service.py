"""The health service: telemetry in, node health events out (to the node streams).

The rules are HealthMonitor's (rules.py); this feeds it every heartbeat and step-time sample
from the telemetry topic and appends what it returns, less what the log already records.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from datetime import UTC, datetime, timedelta

from prometheus_client import Counter

from schemas.base import Event
from schemas.telemetry import NodeHeartbeat, StepTimeSample
from services.health.facts import FACT_TYPES, HealthFacts
from services.health.rules import HealthMonitor, HealthThresholds
from services.health.settings import HealthSettings
from services.runtime.errors import DATABASE_UNAVAILABLE
from services.runtime.metrics import new_registry
from services.runtime.records import StreamAppend
from services.runtime.retry import Outage
from services.runtime.store import EventStore

log = logging.getLogger(__name__)


class HealthService:
    def __init__(self, settings: HealthSettings, store: EventStore) -> None:
        self.settings = settings
        self.store = store
        self.monitor = HealthMonitor(
            HealthThresholds(
                gpu_temperature_c=settings.gpu_temperature_c,
                thermal_samples=settings.thermal_samples,
                nic_ratio=settings.nic_ratio,
                straggler_ratio=settings.straggler_ratio,
                recovery_samples=settings.recovery_samples,
            )
        )
        self.facts = HealthFacts()
        self.position = 0
        self.registry = new_registry()
        self.samples = Counter(
            "gangway_health_samples", "Telemetry samples judged", ["kind"], registry=self.registry
        )
        self.recorded = Counter(
            "gangway_health_events", "Health events recorded", ["type"], registry=self.registry
        )

    async def follow_log(self) -> None:
        while True:
            batch = await self.store.read_all(self.position, 5000, types=FACT_TYPES)
            for envelope in batch:
                self.facts.fold(envelope.payload)
                # A restarted monitor learns what it judged before; an operator's drain holds
                # the node, an operator's undrain has it judged afresh.
                self.monitor.note(envelope.payload)
                self.position = envelope.position or self.position
            if len(batch) < 5000:
                return

    async def on_telemetry(self, message: NodeHeartbeat | StepTimeSample) -> None:
        age = datetime.now(UTC) - message.at
        if age > timedelta(seconds=self.settings.max_sample_age_s):
            self.samples.labels("stale").inc()
            return
        if isinstance(message, NodeHeartbeat):
            self.samples.labels("heartbeat").inc()
            events = self.monitor.observe_heartbeat(message)
        else:
            self.samples.labels("step_time").inc()
            events = self.monitor.observe_step_time(message)
        await self.record([event for event in events if self.facts.is_new(event)])

    async def record(self, events: list[Event]) -> None:
        if not events:
            return
        by_stream: dict[str, list[Event]] = {}
        for event in events:
            by_stream.setdefault(event.stream, []).append(event)
        await self.store.append_many([StreamAppend(s, None, e) for s, e in by_stream.items()])
        for event in events:
            self.facts.fold(event)
            self.recorded.labels(event.type).inc()
            log.info("%s %s", event.type, event.model_dump_json())

    async def poll_log(self, stop: asyncio.Event) -> None:
        # A database away for a while is one line when lost, a summary now and then, one when
        # back (as every service rides it out), not a traceback at every poll.
        outage = Outage(log, "health: the event log")
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.settings.log_poll_interval_s)
            try:
                await self.follow_log()
                outage.recovered()
            except DATABASE_UNAVAILABLE as error:
                outage.failed(error)
            except Exception:
                log.exception("reading the log failed; retrying")
