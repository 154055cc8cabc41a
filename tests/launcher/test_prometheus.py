"""The local Prometheus: its configuration scrapes every service `make up` starts, its alert
rules load, and a real Prometheus (the distribution's package) started by the launcher scrapes
a real API and answers queries for Gangway's series."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gangway import prometheus
from gangway.launcher import (
    Launcher,
    ServiceSpec,
    cmd_status,
    default_services,
    free_port,
    prometheus_service,
)
from services.checkpoint.bootstrap import consumer_of
from services.checkpoint.service import CheckpointService
from services.checkpoint.settings import CheckpointSettings
from services.runtime import EventStore, Settings
from services.runtime.metrics import start_metrics_server
from tests.api.conftest import ADMIN_TOKEN, api_url  # noqa: F401  (fixtures)
from tests.integration.conftest import settings, stack, store  # noqa: F401  (fixtures)


def test_the_launcher_adds_a_prometheus_scraping_every_service() -> None:
    specs = default_services(metrics_port_base=9100)
    monitor = prometheus_service(specs, {})
    assert monitor is not None and monitor.ready_url == "http://127.0.0.1:9090/-/ready"
    targets = prometheus.parse_targets(monitor.env["GANGWAY_PROMETHEUS_TARGETS"])
    assert set(targets) == {spec.name for spec in specs} - {"api"}
    assert targets["relay"] == "127.0.0.1:9100"
    assert prometheus_service(specs, {"GANGWAY_PROMETHEUS": "0"}) is None


def test_make_status_says_where_prometheus_is(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (state / "env").write_text("GANGWAY_PROMETHEUS_URL=http://127.0.0.1:9290\n")
    assert cmd_status(Launcher(state_dir=state)) == 0
    assert "prometheus URL: http://127.0.0.1:9290" in capsys.readouterr().out


@pytest.mark.integration  # needs the distribution's package (make test installs it)
def test_the_configuration_and_the_alert_rules_are_valid(tmp_path: Path) -> None:
    config = tmp_path / "prometheus.yml"
    token = tmp_path / "admin.token"
    token.write_text("t\n")
    config.write_text(
        prometheus.config("http://127.0.0.1:8080", {"relay": "127.0.0.1:9100"}, token_file=token)
    )
    text = config.read_text()
    assert "targets: ['127.0.0.1:8080']" in text and "job_name: relay" in text
    # The API's per-team series are the operator's: its Prometheus presents the admin token.
    assert f"credentials_file: {token}" in text
    for check in (["check", "config", str(config)], ["check", "rules", str(prometheus.RULES)]):
        result = subprocess.run(["promtool", *check], capture_output=True, text=True)
        assert result.returncode == 0, result.stdout + result.stderr


@pytest.fixture
def checkpoint_port(
    settings: Settings,  # noqa: F811
    store: EventStore,  # noqa: F811
    tmp_path: Path,
) -> Iterator[int]:
    """A checkpoint service's metrics endpoint, served as its bootstrap serves it."""
    configured = CheckpointSettings(
        **{**settings.model_dump(), "checkpoint_root": tmp_path / "checkpoints"}, _env_file=None
    )
    service = CheckpointService(configured, store)
    consumer = consumer_of(configured, store, service)  # not run: its lag stays 0
    server = start_metrics_server(0, service.registry)
    try:
        assert consumer.lag == 0
        yield server.port
    finally:
        server.stop()


@pytest.fixture
def monitor(api_url: str, checkpoint_port: int, tmp_path: Path) -> Iterator[str]:  # noqa: F811
    """A real Prometheus scraping the test's API and a checkpoint service, started as
    `make up` starts it."""
    launcher = Launcher(state_dir=tmp_path / "state", env={"GANGWAY_API_URL": api_url})
    address = f"127.0.0.1:{free_port()}"
    checkpoint = ServiceSpec(
        "checkpoint", "services.checkpoint", env={"GANGWAY_METRICS_PORT": str(checkpoint_port)}
    )
    spec = prometheus_service([checkpoint], {"GANGWAY_PROMETHEUS_ADDRESS": address})
    assert spec is not None
    launcher.up([spec], timeout_s=60)
    try:
        yield f"http://{address}"
    finally:
        launcher.down()


@pytest.mark.integration
def test_prometheus_scrapes_the_services_series(monitor: str, api_url: str) -> None:  # noqa: F811
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    team = {"name": "nlp", "guaranteed_gpus": 8, "max_gpus": 16}
    assert httpx.post(f"{api_url}/v1/teams", json=team, headers=admin).status_code == 201
    job = {"name": "waits", "team": "nlp", "tasks": 1, "gpus_per_task": 1, "command": ["true"]}
    assert httpx.post(f"{api_url}/v1/jobs", json=job, headers=admin).status_code == 201
    wanted = {
        "gangway_jobs",
        "gangway_gpus_free_unusable_ratio",
        "gangway_api_consumer_lag_events",
        "gangway_gpus_allocated",
        # One name for every service's consumers: the API's and the checkpoint service's.
        'gangway_consumer_lag_messages{service="api", consumer="events"}',
        'gangway_consumer_lag_messages{service="checkpoint"}',
        'gangway_checkpoint_duration_seconds_count{trigger="eviction"}',
        'gangway_checkpoint_size_bytes_bucket{trigger="periodic"}',
        "gangway_pending_past_estimate_seconds",
        "gangway_pending_past_estimate_jobs",
    }
    deadline = time.monotonic() + 60
    found: set[str] = set()
    while time.monotonic() < deadline:
        for name in wanted - found:
            answer = httpx.get(f"{monitor}/api/v1/query", params={"query": name}).json()
            if answer["status"] == "success" and answer["data"]["result"]:
                found.add(name)
        if found == wanted:
            break
        time.sleep(1)
    assert found == wanted
    up = httpx.get(f"{monitor}/api/v1/query", params={"query": 'up{job="api"}'}).json()
    assert up["data"]["result"][0]["value"][1] == "1"
