"""The local Prometheus `make up` starts: its configuration, written from the services' ports,
then the distribution's `prometheus` binary as this process's child, signals passed on (so the
launcher's supervision, stop, logs and pid checks work as for every service).

Configured by the launcher through the environment:
- GANGWAY_PROMETHEUS_ADDRESS: where it listens (default 127.0.0.1:9090; loopback only);
- GANGWAY_PROMETHEUS_TARGETS: `name=host:port,…`, the services' metrics endpoints;
- GANGWAY_API_URL: the API, scraped at /metrics;
- GANGWAY_ADMIN_TOKEN_FILE: the operator's token, presented to the API's /metrics (which shows
  per-team series to it only);
- GANGWAY_PROMETHEUS_DIR: its configuration and data (default .gangway/prometheus).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import urlsplit

DEFAULT_ADDRESS = "127.0.0.1:9090"
RULES = Path(__file__).resolve().parent.parent / "deploy" / "prometheus" / "alerts.yml"
SCRAPE_INTERVAL_S = 5


def binary() -> str | None:
    """The distribution's Prometheus (apt-get install prometheus), if installed."""
    return shutil.which("prometheus")


def parse_targets(text: str) -> dict[str, str]:
    pairs = (item.split("=", 1) for item in text.split(",") if "=" in item)
    return {name.strip(): target.strip() for name, target in pairs if name.strip()}


def config(
    api_url: str,
    targets: Mapping[str, str],
    rules: Path = RULES,
    token_file: Path | None = None,
) -> str:
    """prometheus.yml: the API (its own /metrics, with the admin token from `token_file` when
    given, for the per-team series) and one job per service."""
    api = urlsplit(api_url)
    lines = [
        "# Written by gangway/prometheus.py at each start; edits are overwritten.",
        "global:",
        f"  scrape_interval: {SCRAPE_INTERVAL_S}s",
        f"  evaluation_interval: {SCRAPE_INTERVAL_S}s",
        "rule_files:",
        f"  - {rules}",
        "scrape_configs:",
        "  - job_name: api",
        f"    scheme: {api.scheme or 'http'}",
    ]
    if token_file is not None:
        lines += [
            "    authorization:",
            "      type: Bearer",
            f"      credentials_file: {token_file}",
        ]
    lines += [
        "    static_configs:",
        f"      - targets: ['{api.netloc}']",
    ]
    for name, target in sorted(targets.items()):
        lines += [
            f"  - job_name: {name}",
            "    static_configs:",
            f"      - targets: ['{target}']",
        ]
    return "\n".join(lines) + "\n"


def argv(prometheus: str, config_file: Path, data_dir: Path, address: str) -> list[str]:
    return [
        prometheus,
        f"--config.file={config_file}",
        f"--storage.tsdb.path={data_dir}",
        f"--web.listen-address={address}",
        "--storage.tsdb.retention.time=15d",
        # The Debian package's console templates are optional; the API and Grafana are the UIs.
        "--web.enable-lifecycle",
    ]


def main(environ: Mapping[str, str] = os.environ) -> int:
    prometheus = binary()
    if prometheus is None:
        print("prometheus is not installed (apt-get install prometheus)", file=sys.stderr)
        return 1
    home = Path(environ.get("GANGWAY_PROMETHEUS_DIR") or ".gangway/prometheus").resolve()
    (home / "data").mkdir(parents=True, exist_ok=True)
    config_file = home / "prometheus.yml"
    token_file = environ.get("GANGWAY_ADMIN_TOKEN_FILE")
    config_file.write_text(
        config(
            environ.get("GANGWAY_API_URL", "http://127.0.0.1:8080"),
            parse_targets(environ.get("GANGWAY_PROMETHEUS_TARGETS", "")),
            token_file=Path(token_file).resolve() if token_file else None,
        )
    )
    address = environ.get("GANGWAY_PROMETHEUS_ADDRESS") or DEFAULT_ADDRESS
    child = subprocess.Popen(argv(prometheus, config_file, home / "data", address))

    def forward(signum: int, frame: object) -> None:
        child.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    return child.wait()


if __name__ == "__main__":
    raise SystemExit(main())
