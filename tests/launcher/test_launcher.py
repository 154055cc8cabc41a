"""The launcher with real processes: start once, readiness, stop, kill; the make-up files."""

from __future__ import annotations

import os
import signal
import socket
import stat
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gangway.launcher import (
    Launcher,
    LauncherError,
    ServiceSpec,
    api_workers,
    cmd_up,
    default_services,
    ensure_admin_token,
    metrics_port_base,
    read_env_file,
    wait_for_dependency,
    write_env_file,
)

# A stand-in service: Python's own HTTP server prints a line once it listens.
SERVER = ServiceSpec(
    "web", "http.server", args=("0", "--bind", "127.0.0.1"), ready_log=r"Serving HTTP"
)


@pytest.fixture
def launcher(tmp_path: Path) -> Iterator[Launcher]:
    running = Launcher(state_dir=tmp_path / "state", env={"PYTHONUNBUFFERED": "1"})
    yield running
    running.down()


def test_a_started_service_is_ready_and_logs_to_its_file(launcher: Launcher) -> None:
    [started] = launcher.up([SERVER], timeout_s=30)
    assert launcher.pid("web") == started.pid
    assert "Serving HTTP" in launcher.read_log("web")
    assert launcher.pid_path("web").read_text().split() == [str(started.pid), "http.server"]


def test_starting_a_running_service_again_leaves_it_running(launcher: Launcher) -> None:
    [first] = launcher.up([SERVER], timeout_s=30)
    [second] = launcher.up([SERVER], timeout_s=30)
    assert second.already_running and second.pid == first.pid


def test_a_second_launcher_sees_what_the_first_started(launcher: Launcher) -> None:
    [started] = launcher.up([SERVER], timeout_s=30)
    other = Launcher(state_dir=launcher.state_dir)
    assert other.running() == {"web": started.pid}
    assert other.stop("web")
    assert launcher.pid("web") is None


def test_stopping_removes_the_process_and_its_pid_file(launcher: Launcher) -> None:
    [started] = launcher.up([SERVER], timeout_s=30)
    assert launcher.stop("web")
    assert not launcher.pid_path("web").exists()
    with pytest.raises(ProcessLookupError):
        os.kill(started.pid, 0)
    assert launcher.stop("web") is False


def test_a_killed_service_is_no_longer_running(launcher: Launcher) -> None:
    launcher.up([SERVER], timeout_s=30)
    launcher.kill("web", signal.SIGKILL)
    deadline = time.monotonic() + 30
    while launcher.pid("web") is not None:
        assert time.monotonic() < deadline, "the killed service still looks alive"
        time.sleep(0.05)
    assert launcher.running() == {}


def test_a_service_that_dies_at_start_fails_with_its_log(launcher: Launcher) -> None:
    broken = ServiceSpec("broken", "gangway_no_such_module", ready_log="never")
    with pytest.raises(LauncherError, match="No module named"):
        launcher.up([broken], timeout_s=30)


def test_services_without_an_entry_point_are_skipped_when_asked(launcher: Launcher) -> None:
    missing = ServiceSpec("missing", "gangway_no_such_module")
    assert launcher.up([missing], skip_missing=True) == []


def test_the_admin_token_is_generated_once_and_private(tmp_path: Path) -> None:
    path = tmp_path / "admin.token"
    token = ensure_admin_token(path)
    assert len(token) >= 40
    assert ensure_admin_token(path) == token
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_the_env_file_gets_the_settings_and_keeps_other_lines(tmp_path: Path) -> None:
    path = tmp_path / "env"
    path.write_text("GANGWAY_PG_OWNER_DSN=owner\nGANGWAY_API_URL=old\n")
    write_env_file(path, {"GANGWAY_API_URL": "http://127.0.0.1:8080", "GANGWAY_PG_DSN": "dsn"})
    assert read_env_file(path) == {
        "GANGWAY_PG_OWNER_DSN": "owner",
        "GANGWAY_API_URL": "http://127.0.0.1:8080",
        "GANGWAY_PG_DSN": "dsn",
    }


def test_the_system_runs_every_service_and_the_fleet_of_the_cluster() -> None:
    specs = {spec.name: spec for spec in default_services(cluster="4x8")}
    assert set(specs) == {
        "relay",
        "admission",
        "scheduler",
        "scheduler-2",
        "inventory",
        "health",
        "checkpoint",
        "agent",
        "api",
    }
    assert specs["agent"].argv(sys.executable)[-2:] == ["--cluster", "4x8"]
    assert specs["inventory"].env["GANGWAY_CLUSTER"] == "4x8"
    assert all(spec.buildable() for spec in specs.values())


def test_make_up_starts_the_api_workers_asked_for_or_one_per_four_cores(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("GANGWAY_API_WORKERS", "3")
    assert api_workers() == 3
    [api] = [s for s in default_services(api_workers=api_workers()) if s.name == "api"]
    assert api.env["GANGWAY_API_WORKERS"] == "3"
    monkeypatch.delenv("GANGWAY_API_WORKERS")
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    assert api_workers() == 1  # the project's 2-core machine: a second one costs more than it gives
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    assert api_workers() == 4


def test_a_pid_file_naming_a_stranger_is_not_trusted(launcher: Launcher) -> None:
    # The pid was reused by another program (here: this test process).
    launcher.pids_dir.mkdir(parents=True)
    launcher.pid_path("api").write_text(f"{os.getpid()}\nservices.api\n")
    assert launcher.pid("api") is None
    assert not launcher.pid_path("api").exists()


def test_a_token_given_in_the_environment_is_the_one_written(tmp_path: Path) -> None:
    path = tmp_path / "admin.token"
    ensure_admin_token(path)
    assert ensure_admin_token(path, "chosen-by-the-operator") == "chosen-by-the-operator"
    assert path.read_text().strip() == "chosen-by-the-operator"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_a_service_whose_supervisor_was_killed_is_not_started_twice(tmp_path: Path) -> None:
    """Found by the attack round (2026-11-23): `kill -9` of a service's supervisor (the pid in
    its pid file) left the service running; the next `up` started a second one beside it and
    forgot the first, which `down` then never stopped (two admissions in one group; for an
    agent, two fleets launching the same ranks). `up` now stops the orphan first."""
    launcher = Launcher(state_dir=tmp_path / "state", env={"PYTHONUNBUFFERED": "1"}, supervise=True)
    try:
        launcher.up([SERVER], timeout_s=30)
        deadline = time.monotonic() + 30
        while not launcher.child_pid_path("web").exists():
            assert time.monotonic() < deadline, "no child pid file"
            time.sleep(0.05)
        orphan = int(launcher.child_pid_path("web").read_text().split()[0])
        supervisor = launcher.pid("web")
        assert supervisor is not None and supervisor != orphan
        os.kill(supervisor, signal.SIGKILL)
        while launcher.pid("web") is not None:
            assert time.monotonic() < deadline, "the killed supervisor still looks alive"
            time.sleep(0.05)
        launcher.up([SERVER], timeout_s=30)
        while True:
            try:
                os.kill(orphan, 0)
            except ProcessLookupError:
                break
            with open(f"/proc/{orphan}/stat") as stat_file:
                if stat_file.read().rsplit(")", 1)[1].split()[0] == "Z":
                    break  # dead, not yet reaped by init
            assert time.monotonic() < deadline + 30, "the orphan still runs beside the new one"
            time.sleep(0.05)
    finally:
        launcher.down()


def test_up_with_the_database_down_says_so_in_one_line_and_starts_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Seen live: `launcher up` with PostgreSQL stopped died in the migrations with a
    # 40-line traceback (the services it would have started wait for the database).
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # nothing listens there once closed
    dsn = f"postgresql://nobody:nothing@127.0.0.1:{port}/gangway"
    monkeypatch.setenv("GANGWAY_PG_DSN", dsn)
    monkeypatch.setenv("GANGWAY_PG_OWNER_DSN", dsn)
    monkeypatch.setenv("GANGWAY_LAUNCHER_WAIT_S", "0")
    launcher = Launcher(state_dir=tmp_path / "state")
    assert cmd_up(launcher) == 1
    err = capsys.readouterr().err
    assert "[launcher] error: PostgreSQL is unreachable" in err
    assert "Traceback" not in err
    assert not (tmp_path / "state" / "pids").exists() or not any(
        (tmp_path / "state" / "pids").iterdir()
    )


def test_waiting_for_a_dependency_goes_on_once_it_answers(
    capsys: pytest.CaptureFixture[str],
) -> None:
    answers = [ConnectionRefusedError(111, "refused"), ConnectionRefusedError(111, "refused")]
    slept: list[float] = []

    async def attempt() -> None:
        if answers:
            raise answers.pop()

    assert wait_for_dependency("PostgreSQL", attempt, (OSError,), 3600, sleep=slept.append)
    assert len(slept) == 2
    err = capsys.readouterr().err
    assert err.count("waiting up to") == 1
    assert "PostgreSQL is back" in err


def test_the_metrics_port_base_is_kept_for_the_next_make_up() -> None:
    # A second installation's `make up` from a new shell (no GANGWAY_METRICS_PORT_BASE) put
    # its services on the first installation's 9100 … 9150.
    assert metrics_port_base({}, {"GANGWAY_METRICS_PORT_BASE": "18200"}) == 18200
    assert metrics_port_base({"GANGWAY_METRICS_PORT_BASE": "18300"}, {}) == 18300
    env = {"GANGWAY_METRICS_PORT_BASE": "18300"}
    assert metrics_port_base(env, {"GANGWAY_METRICS_PORT_BASE": "18200"}) == 18300
    assert metrics_port_base({}, {}) == 9100
