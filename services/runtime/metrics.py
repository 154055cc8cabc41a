"""Prometheus metrics for the services that are not web apps: one HTTP server per process.

Each service builds its metric objects on a registry of its own (`new_registry()`), so two
services started in one process (the tests) never collide on a metric name, then serves it with
`start_metrics_server`. The objects here are the few every event-following service reports.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

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


def start_metrics_server(
    port: int, registry: CollectorRegistry, *, addr: str = "127.0.0.1", fallback: bool = True
) -> MetricsServer:
    """Serve `registry` at http://addr:port/metrics in a daemon thread.

    Port 0 picks a free port (several processes of one service on one machine, the tests);
    the port actually bound is returned and logged. With `fallback`, a port already taken
    (a second replica started with the same settings) costs the metrics their usual port,
    not the process its life: a free port is taken instead, with a warning.
    """
    try:
        server, thread = start_http_server(port, addr=addr, registry=registry)
    except OSError as error:
        if not fallback or port == 0:
            raise
        log.warning("metrics port %d unavailable (%s); using a free port", port, error)
        server, thread = start_http_server(0, addr=addr, registry=registry)
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
