"""The services' Prometheus endpoint (services/runtime/metrics.py)."""

from __future__ import annotations

import urllib.request

import pytest

from services.runtime.metrics import FollowerMetrics, new_registry, start_metrics_server


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        return str(response.read().decode())


def test_the_endpoint_serves_the_services_own_registry() -> None:
    registry = new_registry()
    FollowerMetrics.create("scheduler", registry).events_handled.inc(3)
    server = start_metrics_server(0, registry, addr="127.0.0.1")
    try:
        assert "gangway_scheduler_events_handled_total 3.0" in scrape(server.port)
    finally:
        server.stop()


def test_a_taken_port_falls_back_to_a_free_one() -> None:
    first = start_metrics_server(0, new_registry(), addr="127.0.0.1")
    try:
        second = start_metrics_server(first.port, new_registry(), addr="127.0.0.1")
        try:
            assert second.port != first.port
            scrape(second.port)
        finally:
            second.stop()
    finally:
        first.stop()


def test_without_fallback_a_taken_port_is_an_error() -> None:
    first = start_metrics_server(0, new_registry(), addr="127.0.0.1")
    try:
        with pytest.raises(OSError):
            start_metrics_server(first.port, new_registry(), addr="127.0.0.1", fallback=False)
    finally:
        first.stop()
