"""`gangway why ID`: why the job is where it is, and when it may start."""

from __future__ import annotations

import argparse
from typing import Any

from gangway.commands._common import client, one_line_errors, placement, when

HELP = "explain a job's state: the reason and the estimated start"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("id", metavar="ID")


def explain(job: dict[str, Any]) -> list[str]:
    state = job["state"]
    lines = [f"job {job['id']} is {state}"]
    if job["reason"]:
        code = f" [{job['reason_code']}]" if job.get("reason_code") else ""
        lines.append(f"reason: {job['reason']}{code}")
    if job["estimated_start"]:
        nodes = ", ".join(job["planned_nodes"])
        on = f" on {nodes}" if nodes else ""
        lines.append(f"estimated start: {when(job['estimated_start'])}{on}")
    elif state in ("pending", "queued"):
        lines.append("estimated start: not planned yet")
    if job["placement"]:
        lines.append(f"placement: {placement(job['placement'])}")
    if job["requested"]:
        lines.append(f"requested: {', '.join(job['requested'])}")
    return lines


@one_line_errors
def run(args: argparse.Namespace) -> int:
    with client() as api:
        job = api.job(args.id)
    print("\n".join(explain(job)))
    return 0
