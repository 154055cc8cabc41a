"""`gangway events [--follow]`: the log, oldest first, from a position on."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from gangway.commands._common import at_least_one, client, one_line_errors, seconds_between, when

HELP = "print the event log (--follow keeps printing new events)"

# The payload fields that say most about an event, shown after its type.
_SUMMARY_FIELDS = (
    "job_id",
    "node_id",
    "name",
    "queue",
    "priority",
    "code",
    "reason",
    "message",
    "attempt",
    "rank",
    "start_at",
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--after", type=int, default=0, metavar="POSITION", help="start after it")
    parser.add_argument("--type", action="append", metavar="TYPE", help="only events of TYPE")
    parser.add_argument("--stream", help="only events of this stream (job-<id>, node-<id> …)")
    parser.add_argument(
        "--limit", type=at_least_one, default=None, help="stop after this many events"
    )
    parser.add_argument("--follow", "-f", action="store_true", help="keep printing new events")
    parser.add_argument("--json", action="store_true", help="one JSON object per line")
    parser.add_argument("--interval", type=seconds_between, default=1.0, help=argparse.SUPPRESS)


def line(event: dict[str, Any]) -> str:
    payload = event["payload"]
    summary = " ".join(
        f"{key}={payload[key]}" for key in _SUMMARY_FIELDS if payload.get(key) is not None
    )
    return (
        f"{event['position']:>8} {when(event['recorded_at'])} {event['type']:<20} "
        f"{event['stream']:<28} {summary}"
    ).rstrip()


@one_line_errors
def run(args: argparse.Namespace) -> int:
    cursor = args.after
    printed = 0
    try:
        with client() as api:
            while True:
                page_size = 500 if args.limit is None else min(500, args.limit - printed)
                page = api.events(
                    after=cursor, types=args.type, stream=args.stream, limit=max(1, page_size)
                )
                for event in page["items"]:
                    print(json.dumps(event) if args.json else line(event), flush=True)
                    printed += 1
                cursor = page["next"]
                if args.limit is not None and printed >= args.limit:
                    return 0
                if not page["has_more"]:
                    if not args.follow:
                        return 0
                    time.sleep(args.interval)
    except KeyboardInterrupt:
        return 0
