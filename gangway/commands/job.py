"""`gangway job ID`: one job in full."""

from __future__ import annotations

import argparse
import shlex
from datetime import UTC, datetime

from rich.table import Table

from gangway.commands._common import client, console, literal, one_line_errors, placement, when
from gangway.commands.jobs import age

HELP = "show one job"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("id", metavar="ID")


@one_line_errors
def run(args: argparse.Namespace) -> int:
    with client() as api:
        job = api.job(args.id)
    if "elements" in job:  # an array: its elements, each `gangway job ID_N` alone
        from gangway.commands.why import explain_array

        print("\n".join(explain_array(job)))
        return 0
    table = Table(show_header=False, box=None)
    command = job["spec"].get("command") or []
    logs = f"gangway logs {job['id']} [--rank N] [--attempt A] [-f]" if job["attempts"] else "-"
    for label, value in (
        ("id", job["id"]),
        ("name", job["name"]),
        ("team", job["team"]),
        ("queue", job["queue"]),
        ("priority", job["priority"]),
        ("state", job["state"]),
        ("reason", job["reason"] or "-"),
        ("estimated start", when(job["estimated_start"])),
        ("gpus", f"{job['gpus']} ({job['tasks']} x {job['gpus_per_task']})"),
        ("placement", placement(job["placement"])),
        ("attempts", str(job["attempts"])),
        ("preemptions", str(job["preemptions"])),
        ("requested", ", ".join(job["requested"]) or "-"),
        ("submitted", f"{when(job['submitted_at'])} by {job['submitted_by']}"),
        ("finished", when(job["finished_at"])),
        ("elapsed", age(job, datetime.now(UTC))),
        ("command", shlex.join(command) if command else "-"),
        ("logs", logs),
    ):
        table.add_row(f"[bold]{label}[/bold]", literal(str(value)))
    console().print(table)
    return 0
