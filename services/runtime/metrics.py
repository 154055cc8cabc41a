"""Prometheus metrics for the services that are not web apps: one HTTP server per process.

Each service builds its metric objects on a registry of its own (`new_registry()`), so two
services started in one process (the tests) never collide on a metric name, then serves it with
`start_metrics_server`. The objects here are the few every event-following service reports.
"""

from __future__ import annotations

import json
import logging
import threading
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol
from wsgiref.simple_server import make_server

from prometheus_client import CollectorRegistry, Counter, Gauge, make_wsgi_app
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import ThreadingWSGIServer, _SilentHandler
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)


def new_registry() -> CollectorRegistry:
    return CollectorRegistry(auto_describe=True)


@dataclass(frozen=True)
class MetricsServer:
    port: int
    server: Any
    thread: Any

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class Follower(Protocol):
    """What /readyz asks of a process's consumer loops."""

    @property
    def name(self) -> str: ...

    @property
    def lag(self) -> int: ...

    @property
    def max_lag(self) -> int: ...


# The consumer loops running in this process (runtime/consumer.py registers each while it
# runs): /readyz is not-ready while any of them trails its partitions by more than its
# threshold (GANGWAY_READY_MAX_LAG_EVENTS).
_FOLLOWERS: weakref.WeakSet[Any] = weakref.WeakSet()


def follow_readiness(follower: Follower) -> None:
    _FOLLOWERS.add(follower)


def unfollow_readiness(follower: Follower) -> None:
    _FOLLOWERS.discard(follower)


class Dependency(Protocol):
    """What /readyz asks of a dependency this process retries (runtime/retry.py's Outage)."""

    @property
    def what(self) -> str: ...

    @property
    def down(self) -> bool: ...


# The dependencies this process reaches (the event log, the bus), each registered by the
# Outage that retries it: /readyz is not-ready while one of them is away, so a service riding
# out a database or broker outage says so instead of only logging it.
_DEPENDENCIES: weakref.WeakSet[Any] = weakref.WeakSet()


def watch_dependency(dependency: Dependency) -> None:
    _DEPENDENCIES.add(dependency)


def readiness(followers: Iterable[Follower] | None = None) -> tuple[bool, dict[str, Any]]:
    """Whether every follower of this process is within its lag threshold and no dependency
    is away; each follower's lag and the dependencies that are."""
    chosen = list(_FOLLOWERS if followers is None else followers)
    lags = {f.name: int(f.lag) for f in chosen}
    behind = {f.name: int(f.lag) for f in chosen if f.lag > f.max_lag}
    away = sorted(d.what for d in list(_DEPENDENCIES) if d.down)
    return not behind and not away, {"lag": lags, "behind": behind, "unavailable": away}


def _app(registry: CollectorRegistry, ready: Callable[[], tuple[bool, dict[str, Any]]]) -> Any:
    metrics = make_wsgi_app(registry)

    def app(environ: dict[str, Any], start_response: Any) -> Any:
        path = environ.get("PATH_INFO", "")
        if path in ("/readyz", "/healthz"):
            ok, detail = ready() if path == "/readyz" else (True, {})
            body = json.dumps({"status": "ok" if ok else "not ready", "detail": detail}).encode()
            start_response(
                "200 OK" if ok else "503 Service Unavailable",
                [("Content-Type", "application/json"), ("Content-Length", str(len(body)))],
            )
            return [body]
        return metrics(environ, start_response)

    return app


def start_http_server(
    port: int,
    addr: str,
    registry: CollectorRegistry,
    ready: Callable[[], tuple[bool, dict[str, Any]]] | None = None,
) -> tuple[Any, threading.Thread]:
    """prometheus_client's server with /readyz and /healthz beside /metrics."""

    class Server(ThreadingWSGIServer):
        pass

    httpd = make_server(
        addr, port, _app(registry, ready or readiness), Server, handler_class=_SilentHandler
    )
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    return httpd, thread


def start_metrics_server(
    port: int,
    registry: CollectorRegistry,
    *,
    addr: str = "127.0.0.1",
    fallback: bool = True,
    ready: Callable[[], tuple[bool, dict[str, Any]]] | None = None,
) -> MetricsServer:
    """Serve `registry` at http://addr:port/metrics in a daemon thread, with /readyz (503
    while a consumer loop of this process trails the bus by more than its threshold) and
    /healthz.

    Port 0 picks a free port (several processes of one service on one machine, the tests);
    the port actually bound is returned and logged. With `fallback`, a port already taken
    (a second replica started with the same settings) costs the metrics their usual port,
    not the process its life: a free port is taken instead, with a warning.
    """
    try:
        server, thread = start_http_server(port, addr, registry, ready)
    except OSError as error:
        if not fallback or port == 0:
            raise
        log.warning("metrics port %d unavailable (%s); using a free port", port, error)
        server, thread = start_http_server(0, addr, registry, ready)
    bound = int(server.server_address[1])
    log.info("metrics at http://%s:%d/metrics", addr, bound)
    return MetricsServer(port=bound, server=server, thread=thread)


@dataclass(frozen=True)
class FollowerMetrics:
    """What every service that follows the log reports: how much it handled, how far behind."""

    events_handled: Counter
    lag_events: Gauge
    position: Gauge

    @classmethod
    def create(cls, service: str, registry: CollectorRegistry) -> FollowerMetrics:
        return cls(
            events_handled=Counter(
                f"gangway_{service}_events_handled",
                f"Events the {service} has folded or handled",
                registry=registry,
            ),
            lag_events=Gauge(
                f"gangway_{service}_lag_events",
                f"Events committed to the log that the {service} has not folded yet",
                registry=registry,
            ),
            position=Gauge(
                f"gangway_{service}_position",
                f"Log position the {service} has folded up to",
                registry=registry,
            ),
        )


class Lagging(Protocol):
    """A consumer loop (runtime/consumer.py) or anything else that knows how far it trails."""

    @property
    def lag(self) -> int: ...


LagSource = Lagging | Callable[[], float]

CONSUMER_LAG = "gangway_consumer_lag_messages"


class ConsumerLag(Collector):
    """`gangway_consumer_lag_messages{service, consumer}`: one series per consuming service and
    what it consumes (`events`: the log, through the bus or read from PostgreSQL; `telemetry`:
    heartbeats and samples), so one alert and one panel cover every service. The consumer
    loops and their consumer groups come and go (a new term, a reconnect): `watch` replaces
    the source of a name; a loop is held weakly, so a finished one is not kept alive."""

    def __init__(self, service: str, registry: CollectorRegistry | None = None) -> None:
        self.service = service
        self._sources: dict[str, weakref.ref[Any] | Callable[[], float]] = {}
        if registry is not None:
            registry.register(self)

    def watch(self, consumer: str, source: LagSource) -> None:
        if hasattr(source, "lag"):
            self._sources[consumer] = weakref.ref(source)
        else:
            assert callable(source)
            self._sources[consumer] = source

    def lags(self) -> dict[str, float]:
        found: dict[str, float] = {}
        for consumer, source in list(self._sources.items()):
            if isinstance(source, weakref.ref):
                loop = source()
                if loop is not None:
                    found[consumer] = float(loop.lag)
            else:
                found[consumer] = float(source())
        return found

    def describe(self) -> Iterable[Metric]:
        return [self._family()]

    def collect(self) -> Iterable[Metric]:
        family = self._family()
        for consumer, lag in sorted(self.lags().items()):
            family.add_metric([self.service, consumer], lag)
        return [family]

    @staticmethod
    def _family() -> GaugeMetricFamily:
        return GaugeMetricFamily(
            CONSUMER_LAG,
            "Messages (log events or telemetry) a service's consumer has not processed yet",
            labels=["service", "consumer"],
        )
