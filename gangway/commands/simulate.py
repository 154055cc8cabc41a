"""`gangway simulate`: replay a job trace through the scheduling core in simulated time."""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

HELP = "replay a job trace through the scheduling core in simulated time"

# Violations listed on stderr when a run has any (the count is always in the JSON).
_SHOWN_VIOLATIONS = 5


class InputError(Exception):
    """Bad input: printed as one line, exit status 2."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--trace", required=True, metavar="CSV", help="job trace (CSV)")
    parser.add_argument(
        "--cluster",
        required=True,
        metavar="SPEC",
        help="NODESxGPUS[:RACK_SIZE[:RACKS_PER_BLOCK]] or a YAML cluster file",
    )
    parser.add_argument("--start", metavar="ISO", help="only jobs submitted at or after this")
    parser.add_argument(
        "--end", metavar="ISO", help="only jobs submitted before this (a bare date: its end)"
    )
    parser.add_argument(
        "--quotas", metavar="CSV", help="tenant,guaranteed_gpus[,max_gpus] per tenant"
    )
    parser.add_argument(
        "--policy",
        choices=("gangway", "fifo", "sjf-oracle", "srtf-oracle"),
        default="gangway",
        help="gangway, or a baseline on the same core and quotas: fifo, or the clairvoyant "
        "sjf-oracle and srtf-oracle (they read duration_s; for comparison only)",
    )
    parser.add_argument("--json", metavar="OUT", help="write the metrics as JSON here")
    parser.add_argument("--plot", metavar="OUT.png", help="write the plot (PNG) here")
    parser.add_argument(
        "--checkpoint-interval",
        default="1800",
        metavar="S|auto",
        help="periodic checkpoint interval of every job, seconds of run time, or auto: "
        "Young-Daly sqrt(2 C MTBF) from the write time C and the gang's failure rate "
        "(default 1800)",
    )
    parser.add_argument(
        "--checkpoint-write",
        type=float,
        default=30.0,
        metavar="S",
        help="time to write a checkpoint, seconds (default 30); periodic ones cost it only "
        "with failures injected",
    )
    parser.add_argument(
        "--node-mtbf-h",
        type=float,
        metavar="H",
        help="inject node failures: mean time between failures of each node, hours",
    )
    parser.add_argument(
        "--gpu-xid-rate",
        type=float,
        default=0.0,
        metavar="R",
        help="inject GPU faults (Xid): faults per GPU-hour",
    )
    parser.add_argument(
        "--seed", type=int, default=0, metavar="N", help="seed of the injected failures"
    )
    parser.add_argument(
        "--node-repair-h",
        type=float,
        default=4.0,
        metavar="H",
        help="hours until a failed node is back (default 4)",
    )
    parser.add_argument(
        "--gpu-repair-h",
        type=float,
        default=1.0,
        metavar="H",
        help="hours until a faulty GPU is back (default 1)",
    )
    parser.add_argument(
        "--no-departures",
        action="store_true",
        help="fill mode: jobs never finish; arrivals go on until the arrived GPU demand "
        "reaches --fill-until times capacity; the JSON adds allocated_share_at_full_demand "
        "and the fragmentation series",
    )
    parser.add_argument(
        "--fill-until",
        type=float,
        default=1.0,
        metavar="SHARE",
        help="with --no-departures: stop arrivals when the arrived GPU demand reaches this "
        "share of capacity (default 1.0)",
    )
    parser.add_argument(
        "--packing",
        choices=("fgd", "best-fit"),
        default="fgd",
        help="with --no-departures: fgd (least fragmentation growth, Gangway's) or the "
        "best-fit baseline",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    except InputError as error:
        print(f"gangway simulate: error: {error}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace) -> int:
    # Imported here so that `gangway --help` and the other commands never load the core.
    from core import ClusterSpecError, SchedulingPolicy, parse_cluster_spec
    from gangway.simulator.engine import AUTO, Simulation, SimulationConfig
    from gangway.simulator.failures import HOUR_S, FailureConfig
    from gangway.simulator.quotas import QuotaError, read_quotas
    from gangway.simulator.report import group_table, headline_table
    from gangway.simulator.trace import TraceError, parse_time, read_trace

    for option, out in (("--json", args.json), ("--plot", args.plot)):
        # Fail before a long run, not after it.
        if out is not None and not Path(out).resolve().parent.is_dir():
            raise InputError(f"{option} {out}: its directory does not exist")
    interval: float | Literal["auto"]
    if args.checkpoint_interval == AUTO:
        interval = AUTO
    else:
        try:
            interval = float(args.checkpoint_interval)
        except ValueError:
            raise InputError("--checkpoint-interval must be a number of seconds or auto") from None
    try:
        config = SimulationConfig(
            checkpoint_interval_s=interval,
            checkpoint_write_s=args.checkpoint_write,
            failures=FailureConfig(
                node_mtbf_h=args.node_mtbf_h,
                gpu_xid_rate=args.gpu_xid_rate,
                seed=args.seed,
                node_repair_s=args.node_repair_h * HOUR_S,
                gpu_repair_s=args.gpu_repair_h * HOUR_S,
            ),
        )
    except ValueError as error:
        raise InputError(_one_line(error)) from None

    spec_path = Path(args.cluster)
    try:
        spec_text = spec_path.read_text(encoding="utf-8") if spec_path.is_file() else args.cluster
        nodes = parse_cluster_spec(spec_text)
    except (ClusterSpecError, OSError, UnicodeDecodeError) as error:
        raise InputError(f"--cluster {args.cluster}: {_one_line(error)}") from None
    if not nodes:
        raise InputError(f"--cluster {args.cluster}: the cluster has no nodes")
    node_gpus = max(len(node.gpus) for node in nodes)

    try:
        start_s = parse_time(args.start) if args.start else None
        end_s = parse_time(args.end, end_of_day=True) if args.end else None
    except TraceError as error:
        raise InputError(f"--start/--end: {error}") from None
    try:
        jobs = read_trace(
            args.trace,
            node_gpus=node_gpus,
            start_s=start_s,
            end_s=end_s,
            # The spec states a number only; "auto" is the simulator's to apply per gang.
            checkpoint_interval_s=None if isinstance(interval, str) else interval,
        )
        quotas = read_quotas(args.quotas) if args.quotas else None
    except (TraceError, QuotaError) as error:
        raise InputError(_one_line(error)) from None
    if not jobs:
        raise InputError(f"{args.trace}: no job in the trace (or in the --start/--end window)")

    skipped = 0
    if quotas is not None:
        # A tenant the quota file does not name has no team: its jobs are left out (as the
        # Helios study leaves out the Philly VCs without a node count), and said so.
        kept = [job for job in jobs if job.tenant in quotas]
        skipped = len(jobs) - len(kept)
        if skipped:
            tenants = sorted({job.tenant for job in jobs} - set(quotas))
            print(
                f"gangway simulate: {skipped} job(s) of tenant(s) without a quota left out: "
                f"{', '.join(tenants)}",
                file=sys.stderr,
            )
        jobs = kept
        if not jobs:
            raise InputError("no job of a tenant named in --quotas")

    if args.no_departures:
        return _fill(args, jobs, nodes)

    if quotas is not None:
        # Invariant 4 (a team can always reach its guarantee) promises every team its whole
        # guarantee at once: guarantees beyond the cluster cannot all be honoured, and the
        # auditor would flag as the scheduler's a violation that is the input's.
        capacity = sum(len(node.gpus) for node in nodes)
        guaranteed = sum(quotas[tenant].guaranteed_gpus for tenant in {job.tenant for job in jobs})
        if guaranteed > capacity:
            raise InputError(
                f"--quotas {args.quotas}: the guarantees of the trace's tenants total "
                f"{guaranteed} GPUs, more than the cluster's {capacity}; lower them or "
                "simulate a larger cluster"
            )

    # Gangway's own policy as configured by default; a baseline is the same core ordered by
    # the simulator (gangway/simulator/baselines.py).
    baseline = None if args.policy == "gangway" else args.policy
    simulation = Simulation(
        jobs, nodes, policy=SchedulingPolicy(), quotas=quotas, config=config, baseline=baseline
    )

    began = time.perf_counter()
    stderr = Console(stderr=True)
    if args.no_progress:
        result = simulation.run()
    else:
        with Progress(
            TextColumn("[bold]simulating[/] {task.fields[clock]}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=stderr,
            transient=False,
        ) as progress:
            task = progress.add_task("jobs", total=len(jobs), clock="")
            last = 0.0

            def report(finished: int, now: float) -> None:
                nonlocal last
                tick = time.monotonic()
                if tick - last >= 0.1:  # throttled: the loop calls this per timestamp
                    last = tick
                    progress.update(task, completed=finished, clock=_clock(now))

            result = simulation.run(report)
            progress.update(task, completed=len(jobs), clock=_clock(result.end_s))
    wall_s = time.perf_counter() - began

    metrics: dict[str, Any] = result.metrics(wall_s=wall_s)
    metrics.update(
        policy=args.policy,
        cluster=args.cluster,
        trace=str(args.trace),
        rejected=sum(1 for record in result.records if record.outcome == "rejected"),
        skipped_jobs=skipped,
        events=result.events,
        cycles=result.cycles,
        s_per_1000_jobs=wall_s / len(jobs) * 1000,
        checkpoint_interval=interval,
        failure_rework_gpu_s=result.failure_rework_gpu_s,
        checkpoint_write_gpu_s=result.checkpoint_write_gpu_s,
        node_failures=result.node_failures,
        gpu_failures=result.gpu_failures,
        seed=args.seed,
    )
    for violation in result.violations[:_SHOWN_VIOLATIONS]:
        print(f"gangway simulate: invariant violated: {violation}", file=sys.stderr)
    if len(result.violations) > _SHOWN_VIOLATIONS:
        more = len(result.violations) - _SHOWN_VIOLATIONS
        print(f"gangway simulate: … and {more} more violation(s)", file=sys.stderr)

    quota_note = f", quotas {Path(args.quotas).name}" if args.quotas else ""
    title = f"{args.policy} on {args.cluster}{quota_note}: {len(jobs):,} jobs"
    try:
        if args.json:
            Path(args.json).write_text(json.dumps(metrics, indent=2) + "\n", encoding="utf-8")
        if args.plot:
            from gangway.simulator.plot import write_plot

            write_plot(
                args.plot,
                result.records,
                result.timeline,
                capacity_gpus=result.capacity_gpus,
                title=title,
            )
    except OSError as error:
        raise InputError(f"cannot write output: {_one_line(error)}") from None

    console = Console()
    console.print(headline_table(metrics, title))
    if len(metrics["per_tenant"]) > 1:
        console.print(group_table(metrics["per_tenant"], "tenant"))
    if len(metrics["per_priority"]) > 1:
        console.print(group_table(metrics["per_priority"], "priority"))
    return 0


def _fill(args: argparse.Namespace, jobs: list[Any], nodes: list[Any]) -> int:
    """Fill mode (gangway/simulator/fill.py): jobs never finish; how much is allocated."""
    from gangway.simulator.fill import run_fill

    if args.fill_until <= 0:
        raise InputError("--fill-until must be a positive share of capacity")
    began = time.perf_counter()
    result = run_fill(jobs, nodes, packing=args.packing, fill_until=args.fill_until)
    metrics: dict[str, Any] = result.as_json()
    # The keys of every run, with what they mean when nothing finishes: no job completes,
    # so no completion or queue times; utilization is the share allocated at the end.
    metrics.update(
        policy=args.policy,
        packing=args.packing,
        cluster=args.cluster,
        trace=str(args.trace),
        completed=0,
        avg_jct_s=None,
        avg_queue_s=None,
        p50_queue_s=None,
        p99_queue_s=None,
        max_queue_s=None,
        avg_queue_gt8_s=None,
        gpu_utilization=result.allocated_share,
        preemptions=0,
        lost_gpu_s=0.0,
        per_tenant={},
        per_priority={},
        wall_s=time.perf_counter() - began,
    )
    if args.json:
        try:
            Path(args.json).write_text(json.dumps(metrics, indent=2) + "\n", encoding="utf-8")
        except OSError as error:
            raise InputError(f"cannot write output: {_one_line(error)}") from None
    at_full = result.allocated_share_at_full_demand
    frag = result.fragmentation[-1]["fragmentation"] if result.fragmentation else 0.0
    print(
        f"{args.packing} on {args.cluster}: {result.jobs:,} jobs arrived, "
        f"{result.placed_jobs:,} placed; allocated at 100% demand: "
        f"{'n/a' if at_full is None else f'{at_full:.1%}'}; allocated now "
        f"{result.allocated_share:.1%}; fragmentation {frag:.1%}; "
        f"{result.geometry_changes} re-partitions"
    )
    return 0


def _clock(seconds: float) -> str:
    # Traces in plain seconds start near 0: show those as seconds rather than as 1970.
    if seconds < 10 * 365 * 86400:
        return f"t={seconds:,.0f}s"
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%d %H:%M")


def _one_line(error: BaseException) -> str:
    text = str(error).strip() or type(error).__name__
    return " ".join(text.split())
