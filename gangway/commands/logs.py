"""`gangway logs JOB [--rank N] [--attempt A] [-f] [--tail N] [--raw]`: a rank's output, through
the API. On a terminal its control characters are spelled out (TerminalOutput); piped or
redirected, or with --raw, it is written byte for byte."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from gangway.client import GangwayClient
from gangway.commands._common import TerminalOutput, client, one_line_errors
from schemas.jobs import TERMINAL_STATES

HELP = "print a rank's output (stdout and stderr); -f follows it until the attempt ends"

# How often `-f` asks whether a job that has not started yet has.
START_POLL_S = 1.0


def wait_for_start(api: GangwayClient, job_id: str) -> None:
    """`-f` on a job still waiting to start (what `gangway submit` then `gangway logs -f` meets):
    wait until it has, saying so once on stderr, rather than fail with 'not found'. A job that
    ends without starting (cancelled, rejected) is left to the API to refuse; an array's id too."""
    said = False
    while True:
        job: dict[str, Any] = api.job(job_id)
        if "attempts" not in job or job["attempts"] > 0 or job["state"] in TERMINAL_STATES:
            return
        if not said:
            print(f"waiting for job {job_id} to start ({job['state']})", file=sys.stderr)
            said = True
        time.sleep(START_POLL_S)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("job_id", metavar="JOB")
    parser.add_argument("--rank", type=int, default=None, help="the rank (default 0)")
    parser.add_argument("--attempt", type=int, default=None, help="the attempt (default latest)")
    parser.add_argument("--follow", "-f", action="store_true", help="keep printing new output")
    parser.add_argument("--tail", type=int, default=None, metavar="N", help="the last N lines")
    parser.add_argument(
        "--raw",
        action="store_true",
        help="write the output byte for byte, escape sequences too, even to a terminal",
    )


@one_line_errors
def run(args: argparse.Namespace) -> int:
    out = sys.stdout.buffer
    terminal = None if args.raw or not sys.stdout.isatty() else TerminalOutput()
    try:
        with client() as api:
            if args.follow and args.attempt is None:
                wait_for_start(api, args.job_id)
            for chunk in api.logs(
                args.job_id,
                rank=args.rank,
                attempt=args.attempt,
                follow=args.follow,
                tail=args.tail,
            ):
                out.write(chunk if terminal is None else terminal.write(chunk))
                out.flush()
    except KeyboardInterrupt:
        return 0
    finally:
        if terminal is not None:
            out.write(terminal.write(b"", final=True))
            out.flush()
    return 0
