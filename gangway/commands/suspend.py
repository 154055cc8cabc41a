"""`gangway suspend ID`: ask to suspend a job (the scheduler carries it out)."""

from __future__ import annotations

import argparse

from gangway.commands._common import client, one_line_errors

HELP = "ask to suspend a job"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("id", metavar="ID")


@one_line_errors
def run(args: argparse.Namespace) -> int:
    with client() as api:
        job = api.request(args.id, "suspend")
    print(f"suspend requested for job {job['id']} (now {job['state']})")
    return 0
