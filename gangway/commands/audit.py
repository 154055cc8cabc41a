"""`gangway audit`: replay the log through the core's Auditor; exit 1 on any violation."""

from __future__ import annotations

import argparse
import asyncio
import time

from rich.table import Table

from core import Auditor, SchedulingPolicy, Violation
from core.audit import RULES
from gangway.commands._common import at_least_one, console, one_line_errors
from gangway.commands._log import open_log

HELP = "check the invariants and scheduling promises over the whole event log"

INVARIANTS = {
    1: "a GPU is bound to at most one gang",
    2: "a gang is bound whole or not at all",
    3: "nothing placed on a drained, lost or unhealthy node or GPU",
    4: "a team can reach its guaranteed quota",
    5: "every job is terminal, or pending with a reason",
    6: "a deposed scheduler's writes are rejected",
}


def describe(violation: Violation) -> tuple[str, str]:
    """The (kind, what it promises) of a violation: an invariant of DESIGN §4 by number, or a
    scheduling rule of §3 by name."""
    if violation.invariant == 0:
        return violation.rule, RULES.get(violation.rule, "")
    return str(violation.invariant), INVARIANTS.get(violation.invariant, "")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--limit", type=at_least_one, default=50, help="violations shown (default 50)"
    )


async def audit_log() -> tuple[list[Violation], int, float]:
    """Every violation, the number of events read, and the seconds it took."""
    auditor = Auditor(SchedulingPolicy())
    started = time.perf_counter()
    events = 0
    last = 0
    async with open_log() as store:
        async for batch in store.iter_raw():
            for raw in batch:
                event = store.registry.decode(raw.type, raw.schema_version, raw.payload)
                auditor.observe(event, raw.position, raw.recorded_at.timestamp(), raw.epoch)
            events += len(batch)
            last = batch[-1].position
    # At the end of the log every waiting job must have been given a reason.
    auditor.check_explained(last)
    return auditor.violations, events, time.perf_counter() - started


@one_line_errors
def run(args: argparse.Namespace) -> int:
    violations, events, seconds = asyncio.run(audit_log())
    out = console()
    out.print(f"audited {events:,} events in {seconds:.2f} s")
    if not violations:
        out.print("[green]no invariant violations[/green]")
        return 0
    table = Table("#", "INVARIANT", "VIOLATION", "POSITIONS")
    for violation in violations[: args.limit]:
        kind, promise = describe(violation)
        table.add_row(
            kind,
            promise,
            violation.message,
            ", ".join(str(p) for p in violation.positions),
        )
    out.print(table)
    hidden = len(violations) - args.limit
    if hidden > 0:
        out.print(f"… and {hidden} more")
    out.print(f"[red]{len(violations)} invariant violation(s)[/red]")
    return 1
