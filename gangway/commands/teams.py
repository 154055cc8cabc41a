"""`gangway teams`: the teams the caller may see (the admin: all; a team's token: its own),
each with its quota and what it holds and waits for."""

from __future__ import annotations

import argparse
import json

from rich.table import Table

from gangway.commands._common import client, console, one_line_errors

HELP = "list teams (a team's token: its own): quota and usage"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-o", "--output", choices=("table", "json"), default="table")


@one_line_errors
def run(args: argparse.Namespace) -> int:
    with client() as api:
        teams = api.teams()["items"]
    if args.output == "json":
        print(json.dumps(teams, indent=2))
        return 0
    table = Table(
        "TEAM", "PARENT", "GUARANTEED", "MAX", "ALLOCATED", "BORROWED", "PENDING", "RUNNING"
    )
    for team in teams:
        table.add_row(
            team["name"],
            team["parent"] or "-",
            str(team["guaranteed_gpus"]),
            "-" if team["max_gpus"] is None else str(team["max_gpus"]),
            str(team["allocated_gpus"]),
            str(team["borrowed_gpus"]),
            str(team["pending_jobs"]),
            str(team["running_jobs"]),
        )
    console().print(table)
    return 0
