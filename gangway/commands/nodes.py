"""`gangway nodes`: every node with its state and GPUs."""

from __future__ import annotations

import argparse

from rich.table import Table

from gangway.commands._common import client, console, one_line_errors

HELP = "list nodes: state, GPUs free and allocated"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--state", help="only nodes in this state (ready, draining, lost …)")


@one_line_errors
def run(args: argparse.Namespace) -> int:
    with client() as api:
        nodes = api.nodes()["items"]
    table = Table(
        "NODE", "RACK", "BLOCK", "TYPE", "STATE", "GPUS", "ALLOC", "FREE", "JOBS", "REASON"
    )
    table.columns[0].no_wrap = True  # an id is useless cut in two
    for node in nodes:
        if args.state and node["state"] != args.state:
            continue
        table.add_row(
            node["id"],
            node["rack"],
            node["block"],
            node["gpu_type"],
            node["state"],
            str(node["gpus"]),
            str(node["allocated_gpus"]),
            str(node["free_gpus"]),
            " ".join(node["jobs"]),
            node["reason"] or "",
        )
    console().print(table)
    return 0
