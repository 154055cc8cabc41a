"""`gangway logs JOB [--rank N] [--attempt A] [-f] [--tail N]`: a rank's output, through the API."""

from __future__ import annotations

import argparse
import sys

from gangway.commands._common import client, one_line_errors

HELP = "print a rank's output (stdout and stderr); -f follows it until the attempt ends"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("job_id", metavar="JOB")
    parser.add_argument("--rank", type=int, default=None, help="the rank (default 0)")
    parser.add_argument("--attempt", type=int, default=None, help="the attempt (default latest)")
    parser.add_argument("--follow", "-f", action="store_true", help="keep printing new output")
    parser.add_argument("--tail", type=int, default=None, metavar="N", help="the last N lines")


@one_line_errors
def run(args: argparse.Namespace) -> int:
    out = sys.stdout.buffer
    try:
        with client() as api:
            for chunk in api.logs(
                args.job_id,
                rank=args.rank,
                attempt=args.attempt,
                follow=args.follow,
                tail=args.tail,
            ):
                out.write(chunk)
                out.flush()
    except KeyboardInterrupt:
        return 0
    return 0
