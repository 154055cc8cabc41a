"""`gangway queues`: the quota tree with each queue's usage."""

from __future__ import annotations

import argparse

from rich.table import Table

from gangway.commands._common import client, console, one_line_errors

HELP = "list queues: guarantee, ceiling, usage, borrowing"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """No options: every queue is listed."""


@one_line_errors
def run(args: argparse.Namespace) -> int:
    with client() as api:
        queues = api.queues()["items"]
    table = Table(
        "QUEUE",
        "PARENT",
        "GUARANTEED",
        "MAX",
        "WEIGHT",
        "ALLOCATED",
        "BORROWED",
        "PENDING",
        "RUNNING",
    )
    for queue in queues:
        table.add_row(
            queue["name"],
            queue["parent"] or "-",
            str(queue["guaranteed_gpus"]),
            "-" if queue["max_gpus"] is None else str(queue["max_gpus"]),
            f"{queue['weight']:g}",
            str(queue["allocated_gpus"]),
            str(queue["borrowed_gpus"]),
            str(queue["pending_jobs"]),
            str(queue["running_jobs"]),
        )
    console().print(table)
    return 0
