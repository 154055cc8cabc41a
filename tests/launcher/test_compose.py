"""docker-compose.yml against the launcher: every service `make up` starts is in the compose
file with the same command and environment, the image's user can write everywhere a service
writes, metrics are exposed and scraped, and Prometheus and Grafana are provisioned.

Docker is not available where Gangway is developed and tested, so the file is checked here,
not run.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from gangway.launcher import REPO_ROOT, default_services

COMPOSE = yaml.safe_load((REPO_ROOT / "docker-compose.yml").read_text())
SERVICES: dict[str, Any] = COMPOSE["services"]
DOCKERFILE = (REPO_ROOT / "Dockerfile").read_text()
DEFAULT_CLUSTER = "${GANGWAY_CLUSTER:-16x8:4:2}"


def environment(name: str) -> dict[str, str]:
    return {key: str(value) for key, value in SERVICES[name]["environment"].items()}


@pytest.mark.parametrize("spec", default_services(), ids=lambda spec: spec.name)
def test_every_service_the_launcher_starts_is_in_the_compose_file(spec: Any) -> None:
    assert spec.name in SERVICES, f"{spec.name} is missing from docker-compose.yml"
    service = SERVICES[spec.name]
    # The default cluster is GANGWAY_CLUSTER's default in both.
    args = [DEFAULT_CLUSTER if arg == "16x8:4:2" else arg for arg in spec.args]
    assert service["command"] == ["python", "-m", spec.module, *args]
    env = environment(spec.name)
    for key, launched in spec.env.items():
        value = DEFAULT_CLUSTER if launched == "16x8:4:2" else launched
        assert key in env, f"{spec.name} lacks {key}"
        # One port per host there, one per container here; the agent is another host here;
        # the API's workers are as many as each deployment's cores allow.
        if key not in {"GANGWAY_METRICS_PORT", "GANGWAY_AGENT_LOGS_URL", "GANGWAY_API_WORKERS"}:
            assert env[key] == value, f"{spec.name}: {key}={env[key]}, the launcher says {value}"
    assert env["GANGWAY_METRICS_PORT"] != "0"


def test_the_api_runs_several_workers_on_its_port() -> None:
    assert int(environment("api")["GANGWAY_API_WORKERS"]) >= 2


def test_a_standby_scheduler_beside_the_leader() -> None:
    schedulers = [name for name in SERVICES if name.startswith("scheduler")]
    assert len(schedulers) >= 2
    instance_ids = {environment(name)["GANGWAY_INSTANCE_ID"] for name in schedulers}
    assert len(instance_ids) == len(schedulers)


def test_what_services_write_lives_where_the_images_user_may_write() -> None:
    assert "USER gangway" in DOCKERFILE and "--uid 10001" in DOCKERFILE
    assert "chown -R gangway /var/lib/gangway" in DOCKERFILE
    written = {
        "api": ["GANGWAY_ADMIN_TOKEN_FILE"],
        "agent": ["GANGWAY_WORK_DIR", "GANGWAY_CHECKPOINT_ROOT", "GANGWAY_FAULT_DIR"],
        "checkpoint": ["GANGWAY_CHECKPOINT_ROOT"],
    }
    for name, keys in written.items():
        env = environment(name)
        for key in keys:
            assert env[key].startswith("/var/lib/gangway/"), (name, key)
    # The ranks' logs stay on the agent's volume; the API asks the agent, at its log port.
    agent_volumes = {v.split(":")[0]: v.split(":")[1] for v in SERVICES["agent"]["volumes"]}
    api_volumes = {v.split(":")[0] for v in SERVICES["api"]["volumes"]}
    assert agent_volumes["rank-logs"] == environment("agent")["GANGWAY_WORK_DIR"]
    assert "rank-logs" not in api_volumes
    port = environment("agent")["GANGWAY_LOG_PORT"]
    assert environment("api")["GANGWAY_AGENT_LOGS_URL"] == f"http://agent:{port}"
    for volume in ("rank-logs", "api-state", "checkpoints"):
        assert volume in COMPOSE["volumes"]


def test_the_dashboard_prometheus_and_grafana_are_reachable() -> None:
    assert "8080:8080" in SERVICES["api"]["ports"]
    assert "9090:9090" in SERVICES["prometheus"]["ports"]
    assert "3000:3000" in SERVICES["grafana"]["ports"]
    mounts = [v.split(":")[0] for v in SERVICES["grafana"]["volumes"]]
    for mount in mounts:
        assert (REPO_ROOT / mount).is_dir(), mount
    assert (REPO_ROOT / "deploy/grafana/dashboards/gangway.json").is_file()


def test_prometheus_in_compose_scrapes_every_service() -> None:
    config = yaml.safe_load((REPO_ROOT / "deploy/prometheus/docker.yml").read_text())
    targets = {
        target.split(":")[0]
        for job in config["scrape_configs"]
        for static in job["static_configs"]
        for target in static["targets"]
    }
    gangway_services = {
        name for name, service in SERVICES.items() if "python" in service.get("command", [])
    }
    assert targets == gangway_services


@pytest.mark.integration  # needs the distribution's promtool (make test installs it)
def test_the_compose_prometheus_configuration_is_valid(tmp_path: Path) -> None:
    # Syntax only: the admin token it reads exists in the api container's volume, not here.
    config = str(REPO_ROOT / "deploy/prometheus/docker.yml")
    result = subprocess.run(
        ["promtool", "check", "config", "--syntax-only", config],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr
