"""A service (re)started while PostgreSQL is away waits for it, quietly, instead of exiting.

attack12: with the database stopped, a supervisor's restart of admission, the agent, the
checkpoint and health services, the relay or the API died at once with a traceback
(`ConnectionRefusedError` from `EventStore.connect` or the migrations), again and again with
the supervisor's backoff; the API meanwhile answered nothing at all, not its 503 with
Retry-After. The scheduler and the inventory already waited (`until_available`).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _environment(tmp_path: Path) -> dict[str, str]:
    port = _closed_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GANGWAY_")}
    env.update(
        GANGWAY_PG_DSN=f"postgresql://gangway_app:x@127.0.0.1:{port}/gangway",
        GANGWAY_PG_OWNER_DSN=f"postgresql://gangway_owner:x@127.0.0.1:{port}/gangway",
        GANGWAY_PG_CONNECT_TIMEOUT_S="2",
        GANGWAY_KAFKA_BOOTSTRAP=f"127.0.0.1:{_closed_port()}",
        GANGWAY_ADMIN_TOKEN="t" * 43,
        GANGWAY_LOG_PORT="0",
        GANGWAY_METRICS_PORT="0",
        GANGWAY_CLUSTER="1x8",
        GANGWAY_RANK_ISOLATION="off",
        GANGWAY_RANK_SANDBOX="none",
        PYTHONPATH=str(ROOT),
        PYTHONUNBUFFERED="1",
    )
    return env


SERVICES = {
    "admission": ["-m", "services.admission"],
    "agent": ["-m", "services.agent", "--cluster", "1x8"],
    "checkpoint": ["-m", "services.checkpoint"],
    "health": ["-m", "services.health"],
    "relay": ["-m", "services.runtime.relay"],
}


def _wait_for_line(process: subprocess.Popen[str], needle: str) -> list[str]:
    """The output up to the first line holding `needle`; fails if the process exits first."""
    assert process.stdout is not None
    seen: list[str] = []
    for line in process.stdout:
        seen.append(line)
        if needle in line:
            return seen
    pytest.fail(f"exited ({process.wait()}) before saying {needle!r}:\n{''.join(seen)}")


def _stop(process: subprocess.Popen[str]) -> tuple[int, str]:
    process.send_signal(signal.SIGTERM)
    out, _ = process.communicate(timeout=60)
    return process.returncode, out


@pytest.mark.parametrize("service", sorted(SERVICES))
def test_a_service_started_while_the_database_is_away_waits_for_it(
    service: str, tmp_path: Path
) -> None:
    process = subprocess.Popen(
        [sys.executable, *SERVICES[service]],
        cwd=tmp_path,
        env=_environment(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        before = _wait_for_line(process, "retrying with backoff")
        status, after = _stop(process)
    finally:
        if process.poll() is None:
            process.kill()
    output = "".join(before) + after
    assert "Traceback" not in output, output
    assert status == 0, output


def test_the_api_started_while_the_database_is_away_answers_503(tmp_path: Path) -> None:
    port = _closed_port()
    env = _environment(tmp_path)
    env["GANGWAY_API_URL"] = f"http://127.0.0.1:{port}"
    process = subprocess.Popen(
        [sys.executable, "-m", "services.api"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        before = _wait_for_line(process, "Application startup complete")
        answer = httpx.get(
            f"http://127.0.0.1:{port}/v1/jobs",
            headers={"Authorization": f"Bearer {'t' * 43}"},
            timeout=30,
        )
        ready = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=30)
        status, after = _stop(process)
    finally:
        if process.poll() is None:
            process.kill()
    output = "".join(before) + after
    assert answer.status_code == 503, answer.text
    assert answer.headers["content-type"].startswith("application/problem+json")
    assert "Retry-After" in answer.headers
    assert ready.status_code == 503
    assert "Traceback" not in output, output
    # uvicorn stops gracefully, then ends by the signal it was sent, as it always does
    assert status in (0, -signal.SIGTERM), output
