"""`gangway usage`: showback, GPU-hours allocated and used per team, GPU type and period.

A table by default; `--csv` prints the same rows for a spreadsheet (finance), `--json` the
API's answer as is.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys

from rich.table import Table

from gangway.commands._common import client, console, iso_time, one_line_errors

HELP = "GPU-hours allocated and used per team (showback)"

CSV_COLUMNS = (
    "team",
    "gpu_type",
    "period_start",
    "period_end",
    "allocated_gpu_hours",
    "used_gpu_hours",
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--team", help="one team only (a team's token sees only its own)")
    parser.add_argument(
        "--from",
        dest="start",
        metavar="ISO",
        type=iso_time,
        help="window start (default 30 days back)",
    )
    parser.add_argument(
        "--to", dest="end", metavar="ISO", type=iso_time, help="window end (default now)"
    )
    parser.add_argument("--by", choices=("day", "week"), default="day", help="bucket size")
    output = parser.add_mutually_exclusive_group()
    output.add_argument("--csv", action="store_true", help="CSV rows, one per team, type, period")
    output.add_argument("--json", action="store_true", help="the API's JSON answer")


def _hours(value: float) -> str:
    # A short job is worth hundredths of a GPU-hour: "0.0" beside "98% used" reads as nothing.
    if 0 < value < 0.01:
        return "<0.01"
    return f"{value:,.2f}" if value < 10 else f"{value:,.1f}"


@one_line_errors
def run(args: argparse.Namespace) -> int:
    with client() as api:
        answer = api.usage(team=args.team, start=args.start, end=args.end, by=args.by)
    if args.json:
        print(json.dumps(answer, indent=2))
        return 0
    if args.csv:
        writer = csv.DictWriter(sys.stdout, fieldnames=CSV_COLUMNS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(answer["items"])
        return 0
    out = console()
    table = Table(
        "PERIOD",
        "TEAM",
        "GPU TYPE",
        "ALLOCATED GPU-H",
        "USED GPU-H",
        "USED %",
        title=f"GPU-hours by {answer['by']}, {answer['start'][:16]} to {answer['end'][:16]} UTC",
    )
    for item in answer["items"]:
        allocated, used = item["allocated_gpu_hours"], item["used_gpu_hours"]
        table.add_row(
            item["period_start"][:10],
            item["team"],
            item["gpu_type"],
            _hours(allocated),
            _hours(used),
            f"{100 * used / allocated:.0f}%" if allocated else "-",
        )
    out.print(table)
    totals = Table(
        "TEAM",
        "GUARANTEED GPUS",
        "MAX GPUS",
        "ALLOCATED GPU-H",
        "USED GPU-H",
        "OF GUARANTEE",
        title="Totals over the window",
    )
    for team in answer["teams"]:
        guaranteed = team["guaranteed_gpu_hours"]
        totals.add_row(
            team["team"],
            str(team["guaranteed_gpus"]),
            "-" if team["max_gpus"] is None else str(team["max_gpus"]),
            _hours(team["allocated_gpu_hours"]),
            _hours(team["used_gpu_hours"]),
            f"{100 * team['allocated_gpu_hours'] / guaranteed:.1f}%" if guaranteed else "-",
        )
    out.print(totals)
    return 0
