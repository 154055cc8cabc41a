"""Cross-checks of the API's read models against the scheduling core's fold of the same log.

Two independent folds of one log must agree on what users see: each job's state and
placement, and the GPUs allocated. A disagreement is a bug in one of them.
"""

from __future__ import annotations

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
    allocated = sum(len(g) for held in models.allocations.values() for g in held.values())
    if allocated != state.allocated_gpus:
        found.append(f"allocated GPUs: core {state.allocated_gpus}, read models {allocated}")
    return found[:limit]
