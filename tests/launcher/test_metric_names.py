"""Every series the Grafana dashboard and the alert rules query is one a service defines: a
renamed metric must not leave a panel or an alert silently empty."""

from __future__ import annotations

import json
import re
from pathlib import Path

from gangway.launcher import REPO_ROOT

NAME = re.compile(r"\bgangway_[a-z0-9_]+")
# What Prometheus' client libraries append to a family's name in its samples.
SUFFIXES = ("_total", "_bucket", "_count", "_sum")


def family(name: str) -> str:
    for suffix in SUFFIXES:
        if name.endswith(suffix):
            return name.removesuffix(suffix)
    return name


def defined() -> set[str]:
    """Metric names written out in the services' code (string literals)."""
    names: set[str] = set()
    for path in (REPO_ROOT / "services").rglob("*.py"):
        for literal in re.findall(r"\"(gangway_[a-z0-9_]+)\"", path.read_text()):
            names.add(family(literal))
    # FollowerMetrics' names are built per service (services/runtime/metrics.py).
    names |= {f"gangway_scheduler_{what}" for what in ("events_handled", "lag_events", "position")}
    return names


def queried(path: Path) -> set[str]:
    text = path.read_text()
    if path.suffix == ".json":
        dashboard = json.loads(text)
        text = " ".join(t["expr"] for p in dashboard["panels"] for t in p.get("targets", []))
    return {family(name) for name in NAME.findall(text)}


def test_the_dashboard_and_the_alerts_query_only_series_the_services_define() -> None:
    known = defined()
    for path in (
        REPO_ROOT / "deploy/grafana/dashboards/gangway.json",
        REPO_ROOT / "deploy/prometheus/alerts.yml",
    ):
        used = queried(path)
        assert used, path
        assert used <= known, f"{path.name} queries undefined series: {sorted(used - known)}"


def test_the_issues_series_are_all_on_the_dashboard() -> None:
    panels = queried(REPO_ROOT / "deploy/grafana/dashboards/gangway.json")
    for name in (
        "gangway_team_gpus_allocated",
        "gangway_team_gpus_busy",
        "gangway_team_gpu_sm_active_ratio",
        "gangway_team_gpu_utilization_ratio",
        "gangway_gpus_free_unusable",
        "gangway_queue_wait_seconds",
        "gangway_jobs",
        "gangway_preemptions",
        "gangway_requeues",
        "gangway_lost_gpu_seconds",
        "gangway_checkpoint_duration_seconds",
        "gangway_checkpoint_size_bytes",
        "gangway_consumer_lag_messages",
        "gangway_relay_lag_events",
        "gangway_pending_past_estimate_seconds",
    ):
        assert name in panels, name
