"""`python -m services.api --workers N`: N processes serve one port (SO_REUSEPORT), each with
a consumer group of its own, stopped together; what must hold across them is in the database
(tests/api/test_team_policy_api.py: the rate across workers)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from gangway.launcher import free_port
from services.api.settings import ApiSettings
from services.api.workers import listening_socket
from services.runtime import Settings
from tests.api.conftest import ADMIN_TOKEN
from tests.integration.support import service_environment

pytestmark = pytest.mark.integration


@pytest.fixture(autouse=True)
def _a_callers_own_api_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """Settings of the caller's own API (a shell that sourced its stack's settings, or runs
    one): the API started here must not listen where they say, nor take the caller's worker
    number or consumer group. With GANGWAY_API_PORT set, both workers listened there and the
    tests waited in vain on the port they had chosen."""
    monkeypatch.setenv("GANGWAY_API_PORT", str(free_port()))
    monkeypatch.setenv("GANGWAY_API_HOST", "127.0.0.2")
    monkeypatch.setenv("GANGWAY_API_WORKER", "3")
    monkeypatch.setenv("GANGWAY_CONSUMER_GROUP", "the-callers-group")


def test_each_worker_reads_the_bus_in_a_consumer_group_of_its_own() -> None:
    first = ApiSettings(topic_prefix="gw", api_worker=1, consumer_group=None, _env_file=None)
    second = ApiSettings(topic_prefix="gw", api_worker=2, consumer_group=None, _env_file=None)
    # The first keeps the group a single API always had; a worker sharing a group would get
    # only some partitions, and its read models only some jobs.
    assert first.bus_group == "gw.api"
    assert second.bus_group == "gw.api-2"


def test_workers_bind_the_same_port_and_a_lone_api_does_not() -> None:
    one = listening_socket("127.0.0.1", 0, shared=True)
    try:
        port = one.getsockname()[1]
        two = listening_socket("127.0.0.1", port, shared=True)
        assert two.getsockname()[1] == port
        two.close()
        # A single API never shares its port with whatever else listens there.
        with pytest.raises(OSError):
            listening_socket("127.0.0.1", port, shared=False)
    finally:
        one.close()


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                # The workers, not multiprocessing's resource tracker beside them.
                command = (entry / "cmdline").read_bytes() if int(stat[1]) == pid else b""
            except OSError:
                continue
            if b"spawn_main" in command and stat[0] != "Z":
                found.append(int(entry.name))
    return found


def _wait(condition: object, what: str, patience_s: float = 60.0, log: Path | None = None) -> None:
    assert callable(condition)
    deadline = time.monotonic() + patience_s
    while not condition():
        if time.monotonic() > deadline:
            tail = log.read_text()[-3000:] if log is not None else ""
            raise AssertionError(f"timed out waiting until {what}\n{tail}")
        time.sleep(0.1)


def _start(settings: Settings, tmp_path: Path, url: str, **extra: str) -> subprocess.Popen[bytes]:
    # Only what is given here: none of the caller's GANGWAY_* variables, and no .gangway/env
    # of the checkout (read from the working directory), configure the API under test.
    env = service_environment(
        settings,
        GANGWAY_API_URL=url,
        GANGWAY_ADMIN_TOKEN=ADMIN_TOKEN,
        GANGWAY_ADMIN_TOKEN_FILE=str(tmp_path / "admin.token"),
        **extra,
    )
    with (tmp_path / "api.log").open("w") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "services.api", "--workers", "2"],
            cwd=tmp_path,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )


def _both_answer(api: subprocess.Popen[bytes], url: str, tmp_path: Path) -> list[int]:
    def both() -> bool:
        # Connections spread over the workers: each answers once its app is up.
        try:
            answers = {httpx.get(f"{url}/healthz", timeout=5).status_code for _ in range(20)}
        except httpx.HTTPError:
            return False
        return answers == {200} and len(_children(api.pid)) >= 2

    _wait(both, "both workers answer", log=tmp_path / "api.log")
    return _children(api.pid)


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state == "Z"


def test_two_workers_serve_one_port_and_one_exiting_stops_the_api(
    settings: Settings, tmp_path: Path
) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    api = _start(settings, tmp_path, url)
    try:
        workers = _both_answer(api, url, tmp_path)
        created = httpx.post(
            f"{url}/v1/teams",
            json={"name": "nlp", "guaranteed_gpus": 0, "max_gpus": None},
            headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
            timeout=30,
        )
        assert created.status_code == 201, created.text
        # One worker dies: the parent stops the other and exits with a failure, so that its
        # supervisor starts the whole API again.
        os.kill(workers[0], signal.SIGKILL)
        assert api.wait(60) == 1
        for pid in workers[1:]:
            _wait(lambda pid=pid: _gone(pid), f"worker {pid} stopped")
    finally:
        if api.poll() is None:
            api.send_signal(signal.SIGTERM)
            api.wait(60)


def test_workers_stop_with_their_parent_even_when_it_is_killed(
    settings: Settings, tmp_path: Path
) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    api = _start(settings, tmp_path, url)
    try:
        workers = _both_answer(api, url, tmp_path)
        api.kill()
        api.wait(60)
        for pid in workers:
            _wait(lambda pid=pid: _gone(pid), f"worker {pid} stopped")
    finally:
        if api.poll() is None:
            api.kill()
            api.wait(60)


def test_a_write_through_one_worker_is_read_through_every_other(
    settings: Settings, tmp_path: Path
) -> None:
    """Read-your-writes across workers: a client that submits (or cancels) through one worker
    and reads through another got 404 for its new job's events, a list without it, or the job
    as it was before its cancel, until that worker's fold caught up (the bus, or the log poll
    every `catch_up_interval_s`). A read now waits for its worker's fold to reach the log's
    head as it was when the read arrived. Here no relay feeds the bus and the log poll is an
    hour apart: only that wait can make the other worker see the write."""
    url = f"http://127.0.0.1:{free_port()}"
    api = _start(settings, tmp_path, url, GANGWAY_CATCH_UP_INTERVAL_S="3600")
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    try:
        _both_answer(api, url, tmp_path)
        # Each request on a connection of its own: the kernel spreads them over both workers,
        # so that each step reads or builds on the step before through either worker.
        for index in range(8):
            name = f"team{index}"
            created = httpx.post(
                f"{url}/v1/teams",
                json={"name": name, "guaranteed_gpus": 0, "max_gpus": None},
                headers=admin,
                timeout=30,
            )
            assert created.status_code == 201, created.text
            team = {"Authorization": f"Bearer {created.json()['token']}"}
            issued = httpx.post(
                f"{url}/v1/teams/{name}/tokens", json={"name": "ci"}, headers=team, timeout=30
            )
            assert issued.status_code == 201, issued.text
            submitted = httpx.post(
                f"{url}/v1/jobs",
                json={"name": "train", "team": name, "tasks": 1, "gpus_per_task": 1},
                headers=team,
                timeout=30,
            )
            assert submitted.status_code == 201, submitted.text
            job_id = submitted.json()["id"]
            events = httpx.get(f"{url}/v1/jobs/{job_id}/events", headers=team, timeout=30)
            assert events.status_code == 200, events.text
            listed = httpx.get(f"{url}/v1/jobs", headers=team, timeout=30)
            assert job_id in [job["id"] for job in listed.json()["items"]], listed.text
            cancelled = httpx.post(f"{url}/v1/jobs/{job_id}/cancel", headers=team, timeout=30)
            assert cancelled.status_code == 202, cancelled.text
            read = httpx.get(f"{url}/v1/jobs/{job_id}", headers=team, timeout=30)
            assert read.status_code == 200, read.text
            assert "cancel" in read.json()["requested"], read.text
            tokens = httpx.get(f"{url}/v1/teams/{name}/tokens", headers=team, timeout=30)
            assert "ci" in [token["name"] for token in tokens.json()["items"]], tokens.text
    finally:
        api.send_signal(signal.SIGTERM)
        api.wait(60)
