"""`gangway nodes`: every node with its state and GPUs."""

from __future__ import annotations

import argparse
from typing import Any

from rich.table import Table

from gangway.commands._common import client, console, one_line_errors

# The API's NodeState (services/api/projections/nodes.py, not imported: it would double the
# command's start), as choices: a mistyped state (`--state drainig`) listed no node, as if
# none were in it.
NODE_STATES = ("ready", "degraded", "draining", "drained", "lost")

HELP = "list nodes: state, GPUs free and allocated, each shared GPU's slices and shares"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--state", choices=NODE_STATES, help="only nodes in this state")
    parser.add_argument(
        "--gpus",
        action="store_true",
        help="one line per GPU: its MIG geometry and who runs in each slice or share",
    )


def describe_gpu(gpu: dict[str, Any]) -> str:
    """'mig: 3g.40gb@0 job-1, 2g.20gb@4 free' / 'shared (750/1000): job-2 500/1000 mps'."""
    mode = str(gpu["mode"])
    if mode == "mig":
        parts = [
            f"{s['profile']}@{s['start']} {'free' if s['free'] else s['job'] or '(in use)'}"
            for s in gpu["geometry"]
        ]
        text = "mig: " + ", ".join(parts)
    elif mode == "shared":
        parts = [
            f"{s['job'] or '(in use)'} {s['thousandths']}/1000 {s['sharing']}"
            + (f" {s['memory_mb']}MB" if s.get("memory_mb") else "")
            for s in gpu["shares"]
        ]
        text = f"shared ({gpu['shared_thousandths']}/1000): " + ", ".join(parts)
    elif mode == "whole":
        text = f"whole: {gpu['job'] or '(in use)'}"
    else:
        text = mode
    if gpu.get("reconfiguring_until"):
        text += f" (re-partitioning until {gpu['reconfiguring_until']})"
    return text


@one_line_errors
def run(args: argparse.Namespace) -> int:
    with client() as api:
        nodes = api.nodes()["items"]
    table = Table(
        "NODE", "RACK", "BLOCK", "TYPE", "STATE", "GPUS", "ALLOC", "FREE", "JOBS", "REASON"
    )
    table.columns[0].no_wrap = True  # an id is useless cut in two
    for node in nodes:
        if args.state and node["state"] != args.state:
            continue
        table.add_row(
            node["id"],
            node["rack"],
            node["block"],
            # A tp gang never goes where NVLink does not join the GPUs (older APIs: it does).
            node["gpu_type"] if node.get("nvlink", True) else f"{node['gpu_type']} (PCIe)",
            node["state"],
            str(node["gpus"]),
            str(node["allocated_gpus"]),
            str(node["free_gpus"]),
            " ".join(node["jobs"]),
            node["reason"] or "",
        )
    console().print(table)
    if args.gpus:
        gpus = Table("NODE", "GPU", "USE")
        for node in nodes:
            if args.state and node["state"] != args.state:
                continue
            for gpu in node.get("gpu_details", []):
                gpus.add_row(node["id"], str(gpu["index"]), describe_gpu(gpu))
        console().print(gpus)
    return 0
