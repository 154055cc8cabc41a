"""`gangway resume ID`: ask to resume a job (the scheduler carries it out)."""

from __future__ import annotations

import argparse

from gangway.commands._common import client, one_line_errors

HELP = "ask to resume a job"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("id", metavar="ID")


@one_line_errors
def run(args: argparse.Namespace) -> int:
    with client() as api:
        job = api.request(args.id, "resume")
    print(f"resume requested for job {job['id']} (now {job['state']})")
    return 0
