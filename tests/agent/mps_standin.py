"""A stand-in `nvidia-cuda-mps-control`, as far as the agent relies on the real one: `-d` returns
at once and leaves a daemon (in a session of its own) that writes its pid to
`nvidia-cuda-mps-control.pid` and makes `control` in CUDA_MPS_PIPE_DIRECTORY (as NVIDIA's MPS
documentation says the real one does) and records the environment it saw; `quit` on the
control's standard input ends it, and on its way out it removes its pipe and its pid file, by
their paths. A second `-d` on a pipe directory whose daemon runs fails, as the real one does.
Its record is a JSON line per event in $MPS_STANDIN_RECORD; `<record>.fail` makes `-d` fail
(exit 1, a message), `<record>.silent` return 0 and start nothing. Two markers stretch the
moments a real daemon takes its time in, for as long as they exist: `<record>.hold` holds a new
daemon (its start recorded, its pid written) before it makes its pipe; `<record>.linger` a
daemon that was told to quit (recorded as `quitting`) before it removes its files and exits, as
one waiting for its MPS server to end."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

SCRIPT = """#!{python}
import json, os, sys, time

RECORD = os.environ["MPS_STANDIN_RECORD"]
WATCHED = ("CUDA_VISIBLE_DEVICES", "CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY")
pipe = os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps")
control = os.path.join(pipe, "control")
PID_FILE = os.path.join(pipe, "nvidia-cuda-mps-control.pid")


def record(**event):
    with open(RECORD, "a") as out:
        out.write(json.dumps(event) + "\\n")


if sys.argv[1:] == ["-d"]:
    if os.path.exists(RECORD + ".fail"):
        print("stand-in: cannot start the MPS control daemon: no such GPU", file=sys.stderr)
        sys.exit(1)
    if os.path.exists(RECORD + ".silent"):
        sys.exit(0)
    if os.path.exists(control):
        print("An instance of this daemon is already running", file=sys.stderr)
        sys.exit(1)
    if os.fork():
        sys.exit(0)
    os.setsid()
    if os.fork():
        os._exit(0)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    with open(PID_FILE, "w") as out:
        out.write(str(os.getpid()) + "\\n")
    # Recorded before its pipe is made: whoever finds the pipe finds the record too.
    record(event="start", pid=os.getpid(), env={{k: os.environ.get(k) for k in WATCHED}})
    while os.path.exists(RECORD + ".hold"):
        time.sleep(0.02)
    os.mkfifo(control)
    while True:
        with open(control) as commands:
            for line in commands:
                if line.strip() == "quit":
                    record(event="quitting", pid=os.getpid())
                    while os.path.exists(RECORD + ".linger"):
                        time.sleep(0.02)
                    # By path, as a daemon cleans up: whatever is there now goes.
                    for path in (control, PID_FILE):
                        try:
                            os.unlink(path)
                        except FileNotFoundError:
                            pass
                    record(event="quit", pid=os.getpid(), pipe=pipe)
                    os._exit(0)
else:
    command = sys.stdin.read()
    if not os.path.exists(control):
        print("Cannot find MPS control daemon process", file=sys.stderr)
        sys.exit(1)
    try:  # a pipe whose daemon died has no reader: refused, as the real one's socket is
        daemon = os.open(control, os.O_WRONLY | os.O_NONBLOCK)
    except OSError:
        print("Cannot find MPS control daemon process", file=sys.stderr)
        sys.exit(1)
    os.write(daemon, command.encode())
    os.close(daemon)
"""


def install(directory: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The stand-in first on PATH; returns its record file."""
    bin_dir = directory / "bin"
    bin_dir.mkdir(parents=True)
    program = bin_dir / "nvidia-cuda-mps-control"
    program.write_text(SCRIPT.format(python=sys.executable))
    program.chmod(0o755)
    record = directory / "mps-record.jsonl"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("MPS_STANDIN_RECORD", str(record))
    return record


def events(record: Path) -> list[dict[str, Any]]:
    if not record.exists():
        return []
    return [json.loads(line) for line in record.read_text().splitlines()]


def live(record: Path) -> dict[int, dict[str, Any]]:
    """The stand-in daemons started and not quit, by pid: each one's start record."""
    running: dict[int, dict[str, Any]] = {}
    for event in events(record):
        if event["event"] == "start":
            running[event["pid"]] = event
        elif event["event"] == "quit":
            running.pop(event["pid"], None)
    return running


def kill_left(record: Path) -> None:
    """End the stand-in daemons a failed test left running (the ones it started itself)."""
    for pid in live(record):
        try:
            os.kill(pid, 15)
        except ProcessLookupError:
            continue


def alive(pid: int) -> bool:
    """Whether process `pid` runs: a daemon killed outright records no quit, and one whose
    parent is gone may stay a zombie here, which holds nothing."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"
