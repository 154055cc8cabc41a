"""`python -m gangway.supervisor --name NAME --child-pid-file PATH -- COMMAND...`: run COMMAND and
start it again whenever it exits, until told to stop.

The services ride out database and broker outages without exiting; this is the backstop for
one that exits anyway (a bug, an OOM kill, a SIGKILL). `make up` runs every service under it
(see gangway/launcher.py), as docker-compose's `restart: unless-stopped` does for containers.

- Restarts back off (1 s, doubling to 30 s, with jitter), and the backoff resets once a run has
  lasted 10 s, so a crash loop costs little and a rare crash is repaired at once.
- SIGTERM / SIGINT are passed to the child; the supervisor exits with it and never restarts it.
- Each exit is one line in the service's log: `[supervisor] NAME exited with status S (run N
  lasted T s); restarting in D s`.
- The child's pid is kept in `--child-pid-file`, so that a test can SIGKILL or SIGSTOP the
  service itself (the supervisor then restarts a killed one).
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

FIRST_BACKOFF_S = 1.0
MAX_BACKOFF_S = 30.0
# A run this long resets the backoff: a crash loop dies while starting, within seconds.
STABLE_AFTER_S = 10.0


def say(message: str) -> None:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
    print(f"[supervisor] {stamp} {message}", file=sys.stderr, flush=True)


class Supervisor:
    def __init__(self, name: str, command: Sequence[str], child_pid_file: Path | None) -> None:
        self.name = name
        self.command = list(command)
        self.child_pid_file = child_pid_file
        self.child: subprocess.Popen[bytes] | None = None
        self.stopping = False

    def on_signal(self, signum: int, _frame: FrameType | None) -> None:
        self.stopping = True
        if self.child is not None and self.child.poll() is None:
            self.child.send_signal(signum)

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self.on_signal)
        signal.signal(signal.SIGINT, self.on_signal)
        backoff = FIRST_BACKOFF_S
        runs = 0
        while not self.stopping:
            runs += 1
            started = time.monotonic()
            self.child = subprocess.Popen(self.command)
            if self.child_pid_file is not None:
                tmp = self.child_pid_file.with_name(f".{self.child_pid_file.name}.tmp")
                tmp.write_text(f"{self.child.pid}\n")
                os.replace(tmp, self.child_pid_file)
            status = self._wait()
            lasted = time.monotonic() - started
            if self.stopping:
                return 0 if status < 0 else status
            if lasted >= STABLE_AFTER_S:
                backoff = FIRST_BACKOFF_S
            delay = random.uniform(backoff / 2, backoff)
            say(
                f"{self.name} exited with status {status} (run {runs} lasted {lasted:.1f} s); "
                f"restarting in {delay:.1f} s"
            )
            deadline = time.monotonic() + delay
            while not self.stopping and time.monotonic() < deadline:
                time.sleep(0.05)
            backoff = min(backoff * 2, MAX_BACKOFF_S)
        return 0

    def _wait(self) -> int:
        assert self.child is not None
        while True:
            try:
                return self.child.wait()
            except InterruptedError:  # pragma: no cover - PEP 475 retries for us
                continue


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gangway.supervisor")
    parser.add_argument("--name", required=True)
    parser.add_argument("--child-pid-file", type=Path)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command to supervise")
    return Supervisor(args.name, command, args.child_pid_file).run()


if __name__ == "__main__":
    raise SystemExit(main())
