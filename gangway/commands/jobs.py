"""`gangway jobs`: the jobs, like squeue: active ones, newest first.

`--all` adds finished ones (after the active ones, newest first too); `--state`, `--team`
filter; `-o wide` adds columns, `-o json` prints the API's records; `--watch` redraws the
table every few seconds (piped: prints a snapshot each time; `-n N` stops after N). Every
page is read: nothing falls off past a thousand jobs.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from rich.console import Group
from rich.table import Table

from gangway.client import GangwayClient
from gangway.commands._common import (
    add_redraw_arguments,
    at_least_one,
    client,
    console,
    one_line_errors,
    placement,
    redraw,
    when,
)
from schemas.jobs import JOB_STATES, TERMINAL_STATES

HELP = "list jobs: active ones newest first (--all for finished ones too)"

ACTIVE_STATES = tuple(state for state in JOB_STATES if state not in TERMINAL_STATES)
PAGE = 1000


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--all", "-a", action="store_true", help="finished jobs too")
    parser.add_argument("--team", help="only this team's jobs")
    parser.add_argument(
        "--state", choices=JOB_STATES, action="append", help="only jobs in this state (repeatable)"
    )
    parser.add_argument(
        "--limit", type=at_least_one, default=None, help="at most this many (newest)"
    )
    parser.add_argument(
        "-o", "--output", choices=("table", "wide", "json"), default="table", help="output format"
    )
    parser.add_argument("--watch", "-w", action="store_true", help="redraw every --interval s")
    add_redraw_arguments(parser)


def fetch(
    api: GangwayClient, *, team: str | None, states: Iterable[str | None]
) -> list[dict[str, Any]]:
    """Every job in any of `states` (None: any state), every page of each."""
    rows: list[dict[str, Any]] = []
    for state in states:
        after: int | None = None
        while True:
            page = api.jobs(team=team, state=state, limit=PAGE, after=after)
            rows += page["items"]
            after = page["next"]
            if after is None:
                break
    return rows


def order(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Active jobs first, then finished ones; newest first within each."""
    newest_first = sorted(rows, key=lambda job: (job["submitted_at"], job["id"]), reverse=True)
    return sorted(newest_first, key=lambda job: job["state"] in TERMINAL_STATES)


def select(api: GangwayClient, args: argparse.Namespace) -> list[dict[str, Any]]:
    states: list[str | None]
    if args.state:
        states = list(dict.fromkeys(args.state))
    elif args.all:
        states = [None]
    else:
        states = list(ACTIVE_STATES)
    rows = fetch(api, team=args.team, states=states)
    if args.limit is not None:
        # The N newest, whatever their state; then listed active ones first. Cutting the
        # listing instead kept an old running job in place of the newest finished ones.
        newest = sorted(rows, key=lambda job: (job["submitted_at"], job["id"]), reverse=True)
        rows = newest[: args.limit]
    return order(rows)


def age(job: dict[str, Any], now: datetime) -> str:
    """How long since submission (until the end, for a finished job), like `2h03m`."""
    start = datetime.fromisoformat(job["submitted_at"])
    end = datetime.fromisoformat(job["finished_at"]) if job.get("finished_at") else now
    seconds = max(0, int((end - start).total_seconds()))
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, seconds = divmod(rest, 60)
    if days:
        return f"{days}d{hours:02d}h"
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{seconds:02d}s"


def gpus(job: dict[str, Any]) -> str:
    """What the job holds per its spec: whole GPUs as a count, slices as `3x1g.10gb`, shares as
    `2x0.5 mps` (a slice or a share is not a GPU; counting each as one misled)."""
    spec = job.get("spec") or {}
    tasks = spec.get("tasks") or 1
    if spec.get("mig_profile"):
        return f"{tasks}x{spec['mig_profile']}"
    if spec.get("gpu_fraction"):
        return f"{tasks}x{spec['gpu_fraction']:g} {spec.get('sharing') or 'mps'}"
    return str(job["gpus"])


def table(rows: list[dict[str, Any]], *, wide: bool) -> Table:
    now = datetime.now(UTC)
    columns = ["ID", "NAME", "TEAM", "PRIORITY", "STATE", "GPUS", "AGE"]
    if wide:
        columns += ["QUEUE", "SUBMITTED", "ATTEMPTS", "EST. START", "NODES"]
    columns.append("REASON")
    result = Table(*columns, caption=f"{len(rows)} job{'' if len(rows) == 1 else 's'}")
    result.columns[0].no_wrap = True  # an id is useless cut in two
    for job in rows:
        cells = [
            job["id"],
            job["name"],
            job["team"],
            job["priority"],
            job["state"],
            gpus(job),
            age(job, now),
        ]
        if wide:
            cells += [
                job["queue"],
                when(job["submitted_at"]),
                str(job["attempts"]),
                when(job["estimated_start"]),
                placement(job["placement"]),
            ]
        cells.append(job["reason"] or "")
        result.add_row(*cells)
    return result


@one_line_errors
def run(args: argparse.Namespace) -> int:
    with client() as api:
        if args.output == "json":
            print(json.dumps(select(api, args), indent=2))
            return 0
        wide = args.output == "wide"
        if not args.watch:
            console().print(table(select(api, args), wide=wide))
            return 0

        def render() -> Group:
            stamp = datetime.now().strftime("%H:%M:%S")
            return Group(f"every {args.interval:g}s, {stamp}", table(select(api, args), wide=wide))

        return redraw(render, interval=args.interval, iterations=args.iterations)
