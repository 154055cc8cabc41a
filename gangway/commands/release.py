"""`gangway release ID`: lift a hold; the job waits for a gang again."""

from __future__ import annotations

import argparse

from gangway.commands._common import client, one_line_errors

HELP = "release a held job (or array): it waits for a gang again"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("id", metavar="ID", help="a job, an array, or one element (ID_3)")


@one_line_errors
def run(args: argparse.Namespace) -> int:
    with client() as api:
        job = api.request(args.id, "release")
    print(f"released job {job['id']} ({job['state']})")
    return 0
