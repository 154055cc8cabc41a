"""`gangway cancel ID`: ask to cancel a job (the scheduler carries it out)."""

from __future__ import annotations

import argparse

from gangway.commands._common import client, one_line_errors

HELP = "ask to cancel a job"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("id", metavar="ID")


@one_line_errors
def run(args: argparse.Namespace) -> int:
    with client() as api:
        job = api.request(args.id, "cancel")
    print(f"cancel requested for job {job['id']} (now {job['state']})")
    return 0
