"""What the web dashboard shows, as one plain snapshot of the read models for one caller.

A pure function of the read models, the caller and the time: the cluster as blocks → racks →
nodes → GPUs with each GPU's state, the queue (waiting jobs with their reason and estimated
start, running ones with their elapsed time), per-team GPU-hours by day against the quota, and
the queue wait distribution. A team's token sees its own jobs and teams; another team's gang
shows as `allocated` with neither job nor team (the capacity is everyone's to see, not whose it
is). The admin sees everything.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime, timedelta
from typing import Any

from core.live_sharing import as_number
from schemas.jobs import HOLDING_STATES, WAITING_STATES
from services.api.activity import GpuActivity
from services.api.auth import Principal
from services.api.projections.cluster import summarize
from services.api.projections.model import ReadModels
from services.api.projections.usage import WAIT_BUCKETS, report

USAGE_DAYS = 14
# The queue list is for a screen: the oldest waiting and the most recently started.
MAX_QUEUE_ROWS = 200


def _iso(moment: datetime | None) -> str | None:
    return None if moment is None else moment.isoformat()


def _gpus(
    models: ReadModels, principal: Principal, activity: GpuActivity | None, now: datetime
) -> list[dict[str, Any]]:
    """blocks → racks → nodes, each node with its GPUs' state and, where visible, job."""
    blocks: dict[str, dict[str, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for node in sorted(models.nodes.values(), key=lambda n: n.id):
        holder: dict[int, str] = {}
        for holding, gpus in models.allocated_on(node.id).items():
            for gpu in gpus:
                holder[gpu] = holding
        cells = []
        for index in node.gpu_indices:
            job_id = holder.get(index)
            job = models.jobs.get(job_id) if job_id is not None else None
            visible = job is not None and principal.can_see(job)
            state: str
            if node.state in ("lost", "drained"):
                state = node.state
            elif index in node.unhealthy_gpus:
                state = "unhealthy"
            elif job_id is not None:
                state = "allocated"  # a draining node's gangs run on until moved
            elif node.state == "draining":
                state = "draining"
            else:
                state = "free"
            cells.append(
                {
                    "index": index,
                    "state": state,
                    "job": job_id if visible else None,
                    "team": job.spec.team if visible and job is not None else None,
                    # From telemetry (0..1), None when not reported lately.
                    "utilization": (
                        None if activity is None else activity.utilization(node.id, index, now)
                    ),
                }
            )
        blocks[node.block][node.rack].append(
            {
                "id": node.id,
                "state": node.state,
                "gpu_type": node.gpu_type,
                "reason": None
                if node.reason is None
                else principal.words(node.reason, models.jobs),
                "degraded": list(node.degraded),
                "gpus": cells,
            }
        )
    return [
        {
            "id": block,
            "racks": [{"id": rack, "nodes": nodes} for rack, nodes in sorted(racks.items())],
        }
        for block, racks in sorted(blocks.items())
    ]


def _queue(models: ReadModels, principal: Principal, now: datetime) -> dict[str, Any]:
    waiting, running = [], []
    # Only the jobs it shows, from the listing index: never every job the log ever had (a
    # team's stream redraws up to 20 times a second; ended jobs are most of the read model).
    shown = sorted(
        (
            models.jobs[job_id]
            for state in {*WAITING_STATES, "suspended", *HOLDING_STATES}
            for job_id in models.listing.ids(principal.team, state)
        ),
        key=lambda job: job.submit_position,
    )
    for job in shown:
        row = {
            "id": job.id,
            "name": job.spec.name,
            "team": job.spec.team,
            "priority": job.priority,
            "state": job.state,
            "gpus": job.gpus,
            "submitted_at": _iso(job.submitted_at),
            "reason": None if job.reason is None else principal.words(job.reason, models.jobs),
            "estimated_start": _iso(job.estimated_start),
            "waited_s": round((now - job.submitted_at).total_seconds()),
        }
        if job.state in WAITING_STATES or job.state == "suspended":
            waiting.append(row)
        else:
            since = models.usage.holding_since(job.id) or job.updated_at
            row["elapsed_s"] = round((now - since).total_seconds())
            row["placement"] = {n: list(g) for n, g in sorted(job.placement.items())}
            running.append(row)
    waiting.sort(key=lambda r: str(r["submitted_at"]))
    running.sort(key=lambda r: str(r["submitted_at"]), reverse=True)
    return {"waiting": waiting[:MAX_QUEUE_ROWS], "running": running[:MAX_QUEUE_ROWS]}


def _usage(models: ReadModels, principal: Principal, now: datetime) -> list[dict[str, Any]]:
    teams = set(models.teams) if principal.is_admin else {principal.team or ""}
    start = (now - timedelta(days=USAGE_DAYS - 1)).replace(
        hour=0, minute=0, second=0, microsecond=0
    )
    rows = report(models.usage, start=start, end=now, by="day", now=now, teams=teams)
    per_team: dict[str, dict[str, list[float]]] = {}
    days = [(start + timedelta(days=i)).date().isoformat() for i in range(USAGE_DAYS)]
    for team in sorted(teams):
        if team in models.teams:
            per_team[team] = {"allocated": [0.0] * USAGE_DAYS, "used": [0.0] * USAGE_DAYS}
    for row in rows:
        series = per_team.setdefault(
            row.team, {"allocated": [0.0] * USAGE_DAYS, "used": [0.0] * USAGE_DAYS}
        )
        day = (row.period_start - start).days
        if 0 <= day < USAGE_DAYS:
            series["allocated"][day] += row.allocated_gpu_hours
            series["used"][day] += row.used_gpu_hours
    result = []
    for team, series in sorted(per_team.items()):
        queue = models.queues.get(team)
        result.append(
            {
                "team": team,
                "days": days,
                "allocated_gpu_hours": [round(v, 3) for v in series["allocated"]],
                "used_gpu_hours": [round(v, 3) for v in series["used"]],
                "guaranteed_gpus": queue.guaranteed_gpus if queue else 0,
                "max_gpus": queue.max_gpus if queue else None,
                "allocated_gpus": as_number(max(0, models.allocated_by_queue.get(team, 0))),
            }
        )
    return result


def _waits(models: ReadModels, principal: Principal) -> dict[str, Any]:
    """Queue wait counts per bucket, per priority class (summed over the visible teams)."""
    by_class: dict[str, list[int]] = {}
    for (priority, team), histogram in models.usage.waits.items():
        if principal.is_admin or team == principal.team:
            counts = by_class.setdefault(priority, [0] * (len(WAIT_BUCKETS) + 1))
            for i, count in enumerate(histogram.counts):
                counts[i] += count
    return {"bounds_s": list(WAIT_BUCKETS), "by_class": dict(sorted(by_class.items()))}


def snapshot(
    models: ReadModels,
    principal: Principal,
    now: datetime | None = None,
    activity: GpuActivity | None = None,
) -> dict[str, Any]:
    moment = now or datetime.now(UTC)
    summary = summarize(models)
    return {
        "at": moment.isoformat(),
        "position": models.watermark.position,
        "viewer": "admin" if principal.is_admin else principal.team,
        "cluster": {
            "nodes": summary.nodes,
            "total_gpus": summary.total_gpus,
            "healthy_gpus": summary.healthy_gpus,
            "allocated_gpus": summary.allocated_gpus,
            "free_gpus": summary.free_gpus,
            "fragmentation": summary.fragmentation,
            "pending_jobs": summary.pending_jobs,
            "running_jobs": summary.holding_jobs,
            "blocks": _gpus(models, principal, activity, moment),
        },
        "queue": _queue(models, principal, moment),
        "usage": _usage(models, principal, moment),
        "waits": _waits(models, principal),
    }
