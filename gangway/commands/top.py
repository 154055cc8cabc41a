"""`gangway top`: a live terminal view of the cluster, the top teams and the queue.

Redrawn every `--interval` seconds from the API (GET /v1/cluster, /v1/queues, /v1/jobs);
`--once` draws it once and exits (for scripts); `-n N` stops after N drawings. Piped or
redirected, each drawing is printed as a plain snapshot after the last (like `top -b`).
A team's token sees its own queue and jobs; the cluster's totals are everyone's.
"""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from typing import Any

from rich.console import Group, RenderableType
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from gangway.client import GangwayClient
from gangway.commands._common import (
    add_redraw_arguments,
    client,
    console,
    one_line_errors,
    redraw,
    when,
)
from gangway.commands.jobs import ACTIVE_STATES, age, fetch, order

HELP = "a live view of the cluster, the queue and the top teams"

# Rows of each section: a terminal, not a report.
TOP_TEAMS = 10
TOP_JOBS = 15


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_redraw_arguments(parser)
    parser.add_argument("--once", action="store_true", help="draw once and exit")


def _bar(used: int, total: int) -> ProgressBar:
    return ProgressBar(total=max(total, 1), completed=min(used, max(total, 1)), width=30)


def cluster_panel(cluster: dict[str, Any]) -> RenderableType:
    nodes = ", ".join(
        f"{count} {state}" for state, count in sorted(cluster["nodes_by_state"].items())
    )
    grid = Table.grid(padding=(0, 2))
    grid.add_row(
        Text("GPUs", style="bold"),
        _bar(cluster["allocated_gpus"], cluster["healthy_gpus"]),
        f"{cluster['allocated_gpus']}/{cluster['healthy_gpus']} allocated "
        f"({100 * cluster['utilization']:.0f}%), {cluster['free_gpus']} free, "
        f"{cluster['total_gpus'] - cluster['healthy_gpus']} unhealthy",
    )
    grid.add_row(
        Text("Free", style="bold"),
        _bar(round(100 * cluster["fragmentation"]), 100),
        f"{cluster['whole_free_nodes']} whole free nodes, "
        f"fragmentation {100 * cluster['fragmentation']:.0f}%",
    )
    pending = (
        ", ".join(f"{n} {c}" for c, n in sorted(cluster["pending_by_class"].items())) or "none"
    )
    grid.add_row(Text("Nodes", style="bold"), Text(nodes), "")
    grid.add_row(
        Text("Jobs", style="bold"),
        Text(f"{cluster['running_jobs']} holding GPUs"),
        f"{cluster['pending_jobs']} pending ({pending})",
    )
    return grid


def teams_table(queues: list[dict[str, Any]]) -> Table:
    table = Table(
        "TEAM",
        "ALLOCATED",
        "",
        "GUARANTEED",
        "MAX",
        "BORROWED",
        "RUNNING",
        "PENDING",
        title="Top teams",
    )
    teams = sorted(
        (q for q in queues if q["is_team"]), key=lambda q: (-q["allocated_gpus"], q["name"])
    )
    for queue in teams[:TOP_TEAMS]:
        ceiling = queue["max_gpus"]
        table.add_row(
            queue["name"],
            str(queue["allocated_gpus"]),
            _bar(queue["allocated_gpus"], ceiling or max(queue["guaranteed_gpus"], 1)),
            str(queue["guaranteed_gpus"]),
            "-" if ceiling is None else str(ceiling),
            str(queue["borrowed_gpus"]),
            str(queue["running_jobs"]),
            str(queue["pending_jobs"]),
        )
    return table


def jobs_table(jobs: list[dict[str, Any]]) -> Table:
    now = datetime.now(UTC)
    table = Table(
        "ID", "TEAM", "PRIORITY", "STATE", "GPUS", "AGE", "EST. START", "REASON", title="Queue"
    )
    table.columns[0].no_wrap = True
    for job in jobs[:TOP_JOBS]:
        table.add_row(
            job["id"],
            job["team"],
            job["priority"],
            job["state"],
            str(job["gpus"]),
            age(job, now),
            when(job["estimated_start"]),
            job["reason"] or "",
        )
    if len(jobs) > TOP_JOBS:
        table.caption = f"and {len(jobs) - TOP_JOBS} more (gangway jobs)"
    return table


def screen(api: GangwayClient) -> RenderableType:
    cluster = api.cluster()
    queues = api.queues()["items"]
    jobs = order(fetch(api, team=None, states=ACTIVE_STATES))
    stamp = datetime.now().strftime("%H:%M:%S")
    return Group(
        Text(f"gangway top — {api.config.api_url} — {stamp}", style="bold"),
        cluster_panel(cluster),
        teams_table(queues),
        jobs_table(jobs),
    )


@one_line_errors
def run(args: argparse.Namespace) -> int:
    with client() as api:
        if args.once:
            console().print(screen(api))
            return 0
        return redraw(
            lambda: screen(api), interval=args.interval, iterations=args.iterations, screen=True
        )
