"""Prometheus metrics of the API: its requests, and the read models' view of the cluster.

Each app gets its own registry, so several apps in one process (the tests) never collide.
Gauges over the read models are computed at scrape time rather than kept in step.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from services.api.activity import GpuActivity
from services.api.feed import ReadModelFeed
from services.api.observability import ObservabilityCollector, Part
from services.api.projections.cluster import summarize
from services.runtime.metrics import ConsumerLag


class ApiMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "gangway_api_requests",
            "HTTP requests served, by route template and status",
            ("method", "route", "status"),
            registry=self.registry,
        )
        self.latency = Histogram(
            "gangway_api_request_seconds",
            "HTTP request latency by route template",
            ("method", "route"),
            registry=self.registry,
        )
        # The labelled children, looked up once per label set (labels() takes a lock and
        # builds a key on every call).
        self._counters: dict[tuple[str, str, str], Counter] = {}
        self._timers: dict[tuple[str, str], Histogram] = {}
        self._feed: ReadModelFeed | None = None
        # GPUs' utilization from telemetry, set by the bootstrap.
        self.activity: GpuActivity | None = None
        self.registry.register(_ReadModelCollector(lambda: self._feed))
        # The read models' distance from the log head (fed by the bus or the log poll, the
        # same lag either way) and the telemetry consumer's, watched by the bootstrap.
        self.consumer_lag = ConsumerLag("api", self.registry)
        # Per-team series (team names, their GPUs, waits, GPU time) are the operator's: they go
        # to a second registry, rendered only for the admin token (docs/security-api.md).
        self.team_registry = CollectorRegistry(auto_describe=True)
        parts: tuple[tuple[CollectorRegistry, Part], ...] = (
            (self.registry, "cluster"),
            (self.team_registry, "teams"),
        )
        for registry, part in parts:
            registry.register(
                ObservabilityCollector(
                    lambda: None if self._feed is None else self._feed.models,
                    lambda: self.activity,
                    part=part,
                )
            )

    def observe(self, method: str, route: str, status: int, seconds: float) -> None:
        """One request served: counted by route template and status, timed by template."""
        counted = (method, route, str(status))
        counter = self._counters.get(counted)
        if counter is None:
            counter = self._counters[counted] = self.requests.labels(*counted)
        counter.inc()
        timer = self._timers.get(counted[:2])
        if timer is None:
            timer = self._timers[counted[:2]] = self.latency.labels(method, route)
        timer.observe(seconds)

    def watch(self, feed: ReadModelFeed) -> None:
        self._feed = feed
        self.consumer_lag.watch("events", lambda: float(feed.lag))

    def render(self, *, operator: bool = False) -> bytes:
        """The exposition text: cluster-wide series for anyone; with the teams' series for the
        operator. Always rendered afresh: a scrape right after a change sees it."""
        if operator:
            return generate_latest(self.registry) + generate_latest(self.team_registry)
        return generate_latest(self.registry)


class _ReadModelCollector(Collector):
    def __init__(self, feed: Callable[[], ReadModelFeed | None]) -> None:
        self._feed = feed

    def collect(self) -> Iterator[Metric]:
        feed = self._feed()
        if feed is None:
            return
        handled = CounterMetricFamily(
            "gangway_api_events_handled", "Events applied to the API's read models"
        )
        handled.add_metric([], feed.models.events_applied)
        yield handled
        lag = GaugeMetricFamily(
            "gangway_api_consumer_lag_events", "Committed events not yet in the read models"
        )
        lag.add_metric([], feed.lag)
        yield lag
        summary = summarize(feed.models)
        pending = GaugeMetricFamily(
            "gangway_pending_jobs", "Jobs pending or queued, by priority class", labels=["class"]
        )
        for cls, count in summary.pending_by_class.items():
            pending.add_metric([cls], count)
        yield pending
        for name, help_text, value in (
            ("gangway_gpus_allocated", "GPUs bound to a gang", summary.allocated_gpus),
            ("gangway_gpus_total", "GPUs of registered nodes", summary.total_gpus),
            ("gangway_gpus_free", "Healthy GPUs bound to no gang", summary.free_gpus),
        ):
            gauge = GaugeMetricFamily(name, help_text)
            gauge.add_metric([], value)
            yield gauge


class RequestMetrics:
    """Counts every HTTP request by its route template (never the raw path: ids would explode
    the label set)."""

    def __init__(self, app: ASGIApp, metrics: ApiMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500
        started = time.perf_counter()

        async def record_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, record_status)
        finally:
            route = scope.get("route")
            template = getattr(route, "path", None) or "unmatched"
            method = str(scope.get("method", ""))
            self.metrics.observe(method, template, status, time.perf_counter() - started)
