"""`gangway undrain NODE`: return a drained node to service."""

from __future__ import annotations

import argparse

from gangway.commands._common import client, one_line_errors

HELP = "return a drained node to service"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("node", metavar="NODE")


@one_line_errors
def run(args: argparse.Namespace) -> int:
    with client() as api:
        node = api.undrain(args.node)
    print(f"node {node['id']} is {node['state']}")
    return 0
