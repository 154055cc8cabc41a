"""Cross-checks of the API's read models against the scheduling core's fold of the same log.

Two independent folds of one log must agree on what users see: each job's state and
placement, and the GPUs allocated. A disagreement is a bug in one of them.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

from core.state import SchedulerState
from services.api.projections.model import ReadModels


def compare_with_core(models: ReadModels, state: SchedulerState, *, limit: int = 20) -> list[str]:
    """Human-readable differences (empty: the read models agree with the core)."""
    found: list[str] = []
    core_jobs = {view.job_id: view for view in state.jobs()}
    for job_id in sorted(set(core_jobs) | set(models.jobs)):
        core = core_jobs.get(job_id)
        ours = models.jobs.get(job_id)
        if core is None or ours is None:
            where = "the core" if core is None else "the read models"
            found.append(f"job {job_id}: missing from {where}")
        elif core.state != ours.state:
            found.append(f"job {job_id}: core {core.state}, read models {ours.state}")
        elif {n: sorted(g) for n, g in core.placement.items()} != {
            n: sorted(g) for n, g in ours.placement.items()
        }:
            found.append(f"job {job_id}: placements differ")
        if len(found) >= limit:
            return found
    # Exact on both sides: slices and shares count their fraction of a GPU.
    allocated = sum((job.held_gpus for job in models.jobs.values() if job.holds_gpus), 0)
    if allocated != state.allocated_gpus:
        found.append(f"allocated GPUs: core {state.allocated_gpus}, read models {allocated}")
    return found[:limit]


def compare_live(
    models: ReadModels,
    live_jobs: Sequence[Mapping[str, Any]],
    *,
    limit: int = 20,
    teams: Collection[str] | None = None,
) -> list[str]:
    """Differences between the jobs a running API shows (`live_jobs`, as GET /v1/jobs gives
    them) and `models`, a rebuild from the log up to the position the API had applied. A job
    shown but absent from the log is what a record forged onto the bus would have left.

    `teams`: the teams whose jobs the caller may see (a team's token sees its own), when not
    every team; the log's jobs of other teams are then not expected from the API."""
    from services.api.auth import Principal
    from services.api.views import job_view

    found: list[str] = []
    live = {str(job["id"]): job for job in live_jobs}
    in_log = {
        job_id
        for job_id, record in models.jobs.items()
        if teams is None or record.spec.team in teams
    }
    for job_id in sorted(set(live) | in_log):
        theirs = live.get(job_id)
        record = models.jobs.get(job_id)
        if record is None:
            found.append(f"job {job_id}: shown by the API, absent from the log")
        elif theirs is None:
            found.append(f"job {job_id}: in the log, not shown by the API")
        else:
            ours = job_view(record, Principal(team=None), models.jobs).model_dump(mode="json")
            for key in ("state", "placement"):
                if ours.get(key) != theirs.get(key):
                    shown, logged = theirs.get(key), ours.get(key)
                    found.append(f"job {job_id}: {key} {shown!r} live, {logged!r} in the log")
        if len(found) >= limit:
            break
    return found[:limit]
