"""`gangway drain NODE`: an operator takes a node out of service (it stays out until undrained)."""

from __future__ import annotations

import argparse
from datetime import datetime
from typing import Any

from gangway.commands._common import client, one_line_errors

HELP = "drain a node: no new work; its gangs are checkpointed and moved"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("node", metavar="NODE")
    parser.add_argument("--reason", default="drained by an operator", help="shown on the node")
    parser.add_argument(
        "--deadline",
        type=datetime.fromisoformat,
        help="ISO time until which running gangs may go on (default: move them now)",
    )


@one_line_errors
def run(args: argparse.Namespace) -> int:
    body: dict[str, Any] = {"reason": args.reason}
    if args.deadline is not None:
        body["deadline"] = args.deadline.isoformat()
    with client() as api:
        node = api.drain(args.node, body)
    print(f"node {node['id']} is {node['state']}: {node['reason']}")
    return 0
