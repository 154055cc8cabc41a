"""`gangway jobs`: a table of jobs (every page), filtered by team or state."""

from __future__ import annotations

import argparse
from typing import Any

from rich.table import Table

from gangway.commands._common import client, console, one_line_errors, when
from schemas.jobs import JOB_STATES

HELP = "list jobs"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--team", help="only this team's jobs")
    parser.add_argument("--state", choices=JOB_STATES, help="only jobs in this state")
    parser.add_argument("--limit", type=int, default=1000, help="at most this many (default 1000)")


@one_line_errors
def run(args: argparse.Namespace) -> int:
    rows: list[dict[str, Any]] = []
    after: int | None = None
    with client() as api:
        while len(rows) < args.limit:
            page = api.jobs(
                team=args.team, state=args.state, limit=min(500, args.limit), after=after
            )
            rows += page["items"]
            after = page["next"]
            if after is None:
                break
    table = Table("ID", "NAME", "TEAM", "QUEUE", "PRIORITY", "STATE", "GPUS", "SUBMITTED", "REASON")
    table.columns[0].no_wrap = True  # an id is useless cut in two
    for job in rows[: args.limit]:
        table.add_row(
            job["id"],
            job["name"],
            job["team"],
            job["queue"],
            job["priority"],
            job["state"],
            str(job["gpus"]),
            when(job["submitted_at"]),
            job["reason"] or "",
        )
    console().print(table)
    return 0
