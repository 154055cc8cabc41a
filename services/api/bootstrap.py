"""Wires the API's pieces: store, read models, feed, commands; starts and stops the feeding.

Started eagerly by the app's lifespan (`python -m services.api`), or lazily by the first request
when the app runs without one (an ASGI transport in a test): then each read catches up with the
log first, since no background feed keeps the models fresh.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field

from core.admission import TeamPolicy
from core.submit_share import RecentSubmissions
from services.api.activity import GpuActivity
from services.api.audit import AuditGate
from services.api.auth import load_admin_token, token_sha256
from services.api.auth_guard import AuthGuard
from services.api.bus import ReadModelConsumer
from services.api.commands import Commands
from services.api.feed import ReadModelFeed
from services.api.metrics import ApiMetrics
from services.api.projections.model import ReadModels
from services.api.projections.tenancy import Tenancy
from services.api.ratelimit import ReadLimiter
from services.api.settings import ApiSettings
from services.api.streams import StreamGate
from services.runtime.consumer import TelemetryConsumer
from services.runtime.errors import DATABASE_UNAVAILABLE
from services.runtime.migrate import migrate_settings
from services.runtime.retry import Outage, until_available
from services.runtime.signals import quiet_library_logs
from services.runtime.store import EventStore

log = logging.getLogger(__name__)

BUS_RETRY_S = 5.0


@dataclass(slots=True)
class ApiContext:
    settings: ApiSettings
    store: EventStore
    feed: ReadModelFeed
    commands: Commands
    admin_sha256: str
    audit_gate: AuditGate
    # True while background tasks feed the models; otherwise reads catch up themselves.
    live: bool = False
    # GPUs' utilization from the telemetry topic (fed while the bus is used).
    activity: GpuActivity = field(default_factory=GpuActivity)
    # The followed logs and dashboard streams each team holds open (services/api/streams.py).
    streams: StreamGate = field(default_factory=StreamGate)
    # Each team's reads in this process (services/api/ratelimit.py).
    reads: ReadLimiter = field(default_factory=ReadLimiter)
    # Refused tokens and each address's failed look-ups (services/api/auth_guard.py).
    auth_guard: AuthGuard | None = None

    @property
    def models(self) -> ReadModels:
        return self.feed.models

    async def fresh(self) -> ReadModels:
        """The read models, caught up with the log first when nothing feeds them."""
        if not self.live:
            await self.feed.refresh_head()
            if self.feed.lag:
                await self.feed.catch_up()
        return self.feed.models

    async def read_barrier(self) -> None:
        """Read-your-writes across API workers: before a read is answered, this worker's fold
        reaches the log's head as it is now, so that whatever was committed before the read
        arrived (a submission or a cancel through another worker, answered a moment ago) is in
        the answer. One indexed query when the fold is there already (the bus usually brought
        it); otherwise the rest is read from the log, as the log poll would a moment later.
        Kubernetes' consistent reads from its watch cache do the same against etcd's revision.

        While the log is unreachable the read is answered from what this worker has (as
        before): a read that needs the log itself answers 503 on its own."""
        if not self.live:
            return  # `fresh` has caught up already
        try:
            await self.feed.reach_head()
        except DATABASE_UNAVAILABLE as error:
            log.debug("read served without the log's head: %r", error)


class ApiBootstrap:
    def __init__(self, settings: ApiSettings, metrics: ApiMetrics) -> None:
        self.settings = settings
        self.metrics = metrics
        self._context: ApiContext | None = None
        self._lock = asyncio.Lock()
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    async def context(self) -> ApiContext:
        if self._context is None:
            async with self._lock:
                if self._context is None:
                    self._context = await self._build()
        return self._context

    async def _build(self) -> ApiContext:
        settings = self.settings
        if settings.pg_owner_dsn:
            await migrate_settings(settings)
        configured = settings.admin_token.get_secret_value() if settings.admin_token else None
        admin = load_admin_token(configured, settings.admin_token_file)
        store = await EventStore.connect(settings, producer="api")
        default_policy = TeamPolicy(
            max_pending_jobs=settings.team_max_pending_jobs,
            submissions_per_second=settings.team_submissions_per_second,
            jobs_per_second=settings.team_jobs_per_second,
        )
        models = ReadModels(
            tenancy=Tenancy(default=default_policy),
            recent_submissions=RecentSubmissions(window_s=settings.shared_window_s),
        )
        feed = ReadModelFeed(store, models)
        try:
            await feed.refresh_head()
            rebuilt = await feed.catch_up()
        except BaseException:
            # Lost again half-way (tried again by the next request, or the start's retry):
            # this attempt's pool is not left open behind it.
            await store.close()
            raise
        log.info("read models rebuilt from %d events (head %d)", rebuilt, feed.head)
        self.metrics.watch(feed)
        context = ApiContext(
            settings,
            store,
            feed,
            Commands(
                store,
                feed,
                shared_jobs_per_second=settings.shared_jobs_per_second,
                shared_max_wait_s=settings.shared_max_wait_s,
            ),
            token_sha256(admin),
            AuditGate(settings.audit_reads_per_team),
            auth_guard=AuthGuard(
                lambda: feed.models.tenancy.tokens,
                rate=settings.auth_failures_per_second,
                ttl_s=settings.auth_refusal_ttl_s,
            ),
        )
        self.metrics.activity = context.activity
        return context

    async def start(self, *, use_bus: bool = True) -> None:
        """Rebuild now, then keep the models fed: from the bus, and from the log as a backstop.

        Started while the database is away (a supervisor's restart during an outage), the API
        serves at once, answering 503 with Retry-After as during any outage, and wires itself
        as soon as the log answers: it exited with a traceback, and answered nothing, until
        the supervisor happened to start it after the database was back."""
        quiet_library_logs()
        self._stop.clear()
        try:
            context = await self.context()
        except DATABASE_UNAVAILABLE as error:
            outage = Outage(log, "api: the event log")
            outage.failed(error)
            self._tasks.append(
                asyncio.create_task(self._start_when_available(outage, use_bus), name="api-start")
            )
            return
        self._feed(context, use_bus)

    async def _start_when_available(self, outage: Outage, use_bus: bool) -> None:
        context = await until_available(
            self.context, outage, self._stop, transient=DATABASE_UNAVAILABLE
        )
        if context is not None:
            log.info("the event log answers: read models rebuilt")
            self._feed(context, use_bus)

    def _feed(self, context: ApiContext, use_bus: bool) -> None:
        self._tasks.append(asyncio.create_task(self._poll_log(context), name="api-log-poll"))
        if use_bus:
            self._tasks.append(asyncio.create_task(self._consume_bus(context), name="api-bus"))
            self._tasks.append(
                asyncio.create_task(self._consume_telemetry(context), name="api-telemetry")
            )
        context.live = True

    async def _poll_log(self, context: ApiContext) -> None:
        # The bus is fast but may lag or be down; the log is complete. Checking its head is one
        # cheap query, and catching up reads only what the bus has not delivered.
        outage = Outage(log, "api: the event log")
        while not self._stop.is_set():
            try:
                await context.feed.refresh_head()
                if context.feed.lag:
                    await context.feed.catch_up()
                outage.recovered()
            except DATABASE_UNAVAILABLE as error:
                outage.failed(error)  # one line when lost, a summary, one when back
            except Exception:
                log.exception("catching up with the log failed; retrying")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), self.settings.catch_up_interval_s)

    async def _consume_bus(self, context: ApiContext) -> None:
        while not self._stop.is_set():
            consumer = ReadModelConsumer(self.settings, context.feed, group=self.settings.bus_group)
            try:
                await consumer.run(self._stop)
            except Exception:
                log.exception("bus consumer stopped; the log poll keeps the models fed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), BUS_RETRY_S)

    async def _consume_telemetry(self, context: ApiContext) -> None:
        # One group per installation: several API replicas would split the GPUs between them
        # (docs/observability.md).
        group = f"{self.settings.bus_group}.telemetry"
        while not self._stop.is_set():
            consumer = TelemetryConsumer(
                self.settings, name=group, handler=context.activity.observe
            )
            self.metrics.consumer_lag.watch("telemetry", consumer)
            try:
                await consumer.run(self._stop)
            except Exception:
                log.exception("telemetry consumer stopped; GPU activity goes stale until back")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), BUS_RETRY_S)

    async def close(self) -> None:
        self._stop.set()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
            self._tasks.clear()
        if self._context is not None:
            self._context.live = False
            await self._context.store.close()
            self._context = None
