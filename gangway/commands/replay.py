"""`gangway replay [--verify]`: rebuild state from the log through the scheduling core.

Without --verify: one full replay, with counts and speed. With --verify: a snapshot + tail
rebuild is compared with a full replay (the scheduler's own check), and the API's read models,
folded from the same log, are compared with the core's state.
"""

from __future__ import annotations

import argparse
import asyncio
import time

from rich.console import Console
from rich.table import Table

from core.policy import SchedulingPolicy
from gangway.client import ClientConfig, ClientError, GangwayClient
from gangway.commands._common import console, one_line_errors
from gangway.commands._log import open_log
from services.api.projections.model import ReadModels
from services.api.projections.verify import compare_live, compare_with_core
from services.runtime.relay import log_identity
from services.runtime.store import EventStore
from services.scheduler.replay import rebuild, verify_replay
from services.scheduler.snapshots import SnapshotStore, code_version

HELP = "replay the event log through the scheduling core (--verify: check it)"
BATCH = 20_000


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--verify",
        action="store_true",
        help="compare snapshot + tail with a full replay, and the read models with the core",
    )


async def fold_read_models(store: EventStore, until: int) -> tuple[ReadModels, float]:
    models = ReadModels()
    started = time.perf_counter()
    position = 0
    while position < until:
        batch = await store.read_all(position, min(BATCH, until - position))
        if not batch:
            break
        models.apply_all(batch)
        position = batch[-1].position or position
    return models, time.perf_counter() - started


def _rate(events: int, seconds: float) -> str:
    return f"{events / seconds:,.0f} events/s" if seconds > 0 else "-"


async def _replay(out: Console) -> int:
    async with open_log() as store:
        policy = SchedulingPolicy()
        rebuilt = await rebuild(store, policy)
        state = rebuilt.folded.state
        models, seconds = await fold_read_models(store, rebuilt.folded.position)
    table = Table("FOLD", "EVENTS", "SECONDS", "RATE")
    table.add_row(
        "scheduling core",
        f"{rebuilt.events_replayed:,}",
        f"{rebuilt.seconds:.3f}",
        _rate(rebuilt.events_replayed, rebuilt.seconds),
    )
    table.add_row(
        "API read models",
        f"{models.events_applied:,}",
        f"{seconds:.3f}",
        _rate(models.events_applied, seconds),
    )
    out.print(table)
    jobs = sum(1 for _ in state.jobs())
    out.print(
        f"position {rebuilt.folded.position}: {jobs} jobs ({state.pending} pending), "
        f"{sum(1 for _ in state.nodes())} nodes, "
        f"{state.allocated_gpus}/{state.total_gpus} GPUs allocated"
    )
    return 0


async def _verify(out: Console) -> int:
    async with open_log() as store:
        policy = SchedulingPolicy()
        snapshots = SnapshotStore(store.pool, code_version(policy))
        report = await verify_replay(store, policy, snapshots)
        full = await rebuild(store, policy, until=report.position)
        models, _ = await fold_read_models(store, report.position)
        live = await _live_differences(store)
    origin = "stored" if report.snapshot_stored else "taken in memory"
    out.print(
        f"full replay: {report.events_full:,} events in {report.full_seconds:.3f} s "
        f"({_rate(report.events_full, report.full_seconds)})"
    )
    out.print(
        f"snapshot ({origin}) at {report.snapshot_position} + tail: {report.events_tail:,} events "
        f"in {report.snapshot_seconds:.3f} s"
    )
    projection = compare_with_core(models, full.folded.state)
    failed = False
    checks = [
        ("snapshot + tail vs full replay", report.differences),
        ("read models vs core", projection),
    ]
    if isinstance(live, str):
        out.print(f"[yellow]SKIPPED[/yellow] live read models vs the log: {live}")
    else:
        checks.append(("live read models vs the log", live))
    for label, differences in checks:
        if differences:
            failed = True
            out.print(f"[red]MISMATCH[/red] {label}:")
            for difference in differences:
                out.print(f"  {difference}")
        else:
            out.print(f"[green]OK[/green] {label}: same state at position {report.position}")
    return 1 if failed else 0


async def _live_differences(store: EventStore) -> list[str] | str:
    """The running API's jobs compared with a rebuild of the read models from the log up to
    the position the API had applied; a string says why they could not be compared."""
    ours = await log_identity(store)
    try:
        with GangwayClient(ClientConfig.load(), timeout_s=10) as client:
            served = client.ready()["detail"].get("log")
            if served != ours:
                return f"the API at {client.config.api_url} serves another log"
            # A team's token (GANGWAY_TOKEN, as the README's quick start leaves it) sees its own
            # team's jobs only; the admin sees every team.
            visible = {str(team["name"]) for team in client.teams()["items"]}
            for _ in range(10):
                before = int(client.ready()["detail"]["applied"])
                jobs: list[dict[str, object]] = []
                after: int | None = None
                while True:
                    page = client.jobs(limit=1000, after=after)
                    jobs += page["items"]
                    after = page.get("next")
                    if after is None:
                        break
                if int(client.ready()["detail"]["applied"]) == before:
                    break
                await asyncio.sleep(0.2)
            else:
                return "the API's read models kept moving while they were read"
    except (ClientError, KeyError, TypeError, ValueError) as error:
        return f"no running API to compare with ({error})"
    models, _ = await fold_read_models(store, before)
    return compare_live(models, jobs, teams=None if set(models.teams) <= visible else visible)


@one_line_errors
def run(args: argparse.Namespace) -> int:
    return asyncio.run(_verify(console()) if args.verify else _replay(console()))
