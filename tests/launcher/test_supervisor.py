"""gangway.supervisor: a service that exits is started again; a stop stops it for good."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

from gangway.launcher import _alive

PATIENCE_S = 30.0


def wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + PATIENCE_S
    while not condition():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.05)


def test_a_service_that_exits_is_restarted_and_sigterm_ends_both(tmp_path: Path) -> None:
    marker = tmp_path / "crashed-once"
    child_pid_file = tmp_path / "child.pid"
    program = textwrap.dedent(
        f"""
        import pathlib, sys, time
        marker = pathlib.Path({str(marker)!r})
        if not marker.exists():
            marker.write_text("x")
            sys.exit(3)
        print("second run", flush=True)
        time.sleep(600)
        """
    )
    log = (tmp_path / "service.log").open("w")
    supervisor = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gangway.supervisor",
            "--name",
            "flaky",
            "--child-pid-file",
            str(child_pid_file),
            "--",
            sys.executable,
            "-c",
            program,
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        output = tmp_path / "service.log"
        wait_for(lambda: "second run" in output.read_text(), "the service runs again")
        assert "[supervisor]" in output.read_text()
        assert "flaky exited with status 3" in output.read_text()
        child = int(child_pid_file.read_text())
        assert _alive(child)
        # A killed service is restarted too, under a new pid.
        os.kill(child, signal.SIGKILL)
        wait_for(
            lambda: child_pid_file.exists() and int(child_pid_file.read_text()) != child,
            "a new child after the SIGKILL",
        )
        restarted = int(child_pid_file.read_text())
        supervisor.send_signal(signal.SIGTERM)
        assert supervisor.wait(timeout=PATIENCE_S) in (0, -signal.SIGTERM, 128 + signal.SIGTERM)
        wait_for(lambda: not _alive(restarted), "the service stopped with its supervisor")
        assert output.read_text().count("exited with status") == 2
    finally:
        if supervisor.poll() is None:
            supervisor.kill()
        log.close()
