"""`gangway hold ID`: keep a waiting job (or every element of an array) from being placed."""

from __future__ import annotations

import argparse

from gangway.commands._common import client, one_line_errors

HELP = "hold a waiting job (or array): it is never placed until released"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("id", metavar="ID", help="a job, an array, or one element (ID_3)")


@one_line_errors
def run(args: argparse.Namespace) -> int:
    with client() as api:
        job = api.request(args.id, "hold")
    print(f"held job {job['id']} ({job['state']})")
    return 0
