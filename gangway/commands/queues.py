"""`gangway queues`: the quota tree with each queue's usage."""

from __future__ import annotations

import argparse

from rich.table import Table

from gangway.commands._common import client, console, one_line_errors

HELP = "list queues: guarantee, ceilings (GPUs, CPUs, memory), usage, borrowing"


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
        "CPUS",
        "MEMORY",
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
            _held_of(queue.get("allocated_cpus", 0), queue.get("max_cpus"), ""),
            _held_of(queue.get("allocated_memory_mb", 0), queue.get("max_memory_mb"), " MB"),
        )
    console().print(table)
    return 0


def _held_of(held: float, ceiling: int | None, unit: str) -> str:
    """What the queue's gangs hold of a host resource, over its ceiling ('-': none)."""
    return f"{held:g}/-" if ceiling is None else f"{held:g}/{ceiling}{unit}"
