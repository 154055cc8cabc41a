"""`gangway why ID`: why the job is where it is, and when it may start."""

from __future__ import annotations

import argparse
from typing import Any

from gangway.commands._common import client, one_line_errors, placement, when

HELP = "explain a job's state: the reason and the estimated start"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("id", metavar="ID")


def explain(job: dict[str, Any]) -> list[str]:
    state = job["state"]
    lines = [f"job {job['id']} is {state}"]
    if job["reason"]:
        code = f" [{job['reason_code']}]" if job.get("reason_code") else ""
        lines.append(f"reason: {job['reason']}{code}")
    if job["estimated_start"]:
        nodes = ", ".join(job["planned_nodes"])
        on = f" on {nodes}" if nodes else ""
        lines.append(f"estimated start: {when(job['estimated_start'])}{on}")
    elif state in ("pending", "queued"):
        # Only the job first in line for busy GPUs is planned a start (ReservationPlanned):
        # "not planned yet" promised one to every job behind it, or blocked by its quota.
        lines.append("estimated start: none (only the job first in line for GPUs gets one)")
    if job["placement"]:
        lines.append(f"placement: {placement(job['placement'])}")
    if job["requested"]:
        lines.append(f"requested: {', '.join(job['requested'])}")
    return lines


_VERDICTS = ("CheckpointCommitted", "CheckpointFailed", "CheckpointCorrupted")


def checkpoint_line(events: list[dict[str, Any]]) -> str | None:
    """The last checkpoint verdict of the job, so a failed one is not noticed too late."""
    verdicts = [event for event in events if event["type"] in _VERDICTS]
    if not verdicts:
        return None
    last = verdicts[-1]
    payload = last["payload"]
    head = f"last checkpoint: {payload['checkpoint_id']}"
    at = when(last["recorded_at"])
    if last["type"] == "CheckpointCommitted":
        return f"{head} committed at {at} (step {payload['step']})"
    verdict = "failed" if last["type"] == "CheckpointFailed" else "corrupted"
    corrupted = {
        e["payload"]["checkpoint_id"] for e in verdicts if e["type"] == "CheckpointCorrupted"
    }
    good = [
        e
        for e in verdicts
        if e["type"] == "CheckpointCommitted" and e["payload"]["checkpoint_id"] not in corrupted
    ]
    fallback = (
        f"; resumes from {good[-1]['payload']['checkpoint_id']}"
        if good
        else "; no good checkpoint yet"
    )
    return f"{head} {verdict} at {at}: {payload['reason']}{fallback}"


def explain_array(array: dict[str, Any]) -> list[str]:
    """An array: its elements counted by state, then each waiting or failed element's reason
    (elements are named `ID_N`; `gangway why ID_N` tells one alone)."""
    counts = ", ".join(f"{count} {state}" for state, count in sorted(array["states"].items()))
    limit = array.get("max_parallel")
    parallel = f", at most {limit} at once" if limit else ""
    lines = [f"array {array['id']} is {array['state']}: {array['count']} jobs{parallel} ({counts})"]
    for element in array["elements"]:
        if element["reason"] and element["state"] not in ("succeeded",):
            code = f" [{element['reason_code']}]" if element.get("reason_code") else ""
            lines.append(f"  {element['id']} {element['state']}: {element['reason']}{code}")
    return lines


@one_line_errors
def run(args: argparse.Namespace) -> int:
    with client() as api:
        job = api.job(args.id)
        if "elements" in job:
            print("\n".join(explain_array(job)))
            return 0
        events = api.job_events(args.id)["items"]
    lines = explain(job)
    checkpoint = checkpoint_line(events)
    if checkpoint is not None:
        lines.append(checkpoint)
    print("\n".join(lines))
    return 0
