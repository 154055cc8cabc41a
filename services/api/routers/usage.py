"""GET /v1/usage: showback, GPU-hours allocated and used per team, GPU type and day or week.

Read from the usage book (services/api/projections/usage.py), folded from the log like every
read model, so a replay gives the same figures. A team's token sees its own team only (asking
for another is 403); the admin sees every team, or the one asked for (a team that does not exist
is 404).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Annotated

from fastapi import APIRouter, Query

from services.api.deps import Caller, Models
from services.api.models import View
from services.api.problems import PROBLEM_RESPONSES, ProblemError, not_found
from services.api.projections.usage import Bucket, period_start, report

router = APIRouter(prefix="/v1/usage", tags=["usage"], responses=PROBLEM_RESPONSES)

# Without `from`: this many days back from `to`.
DEFAULT_DAYS = 30
# A bound on the buckets one answer may hold (about three years of days).
MAX_PERIODS = 1100


class UsageItem(View):
    team: str
    gpu_type: str
    period_start: datetime
    period_end: datetime
    allocated_gpu_hours: float
    used_gpu_hours: float
    allocated_cpu_hours: float = 0.0


class TeamUsage(View):
    team: str
    guaranteed_gpus: int
    max_gpus: int | None
    # What the guarantee and the ceiling amount to over the window, for comparison.
    guaranteed_gpu_hours: float
    max_gpu_hours: float | None
    allocated_gpu_hours: float
    used_gpu_hours: float
    allocated_cpu_hours: float = 0.0
    # The queue's CPU and memory ceilings (None: none).
    max_cpus: int | None = None
    max_memory_mb: int | None = None


class UsageReport(View):
    start: datetime
    end: datetime
    by: Bucket
    items: list[UsageItem]
    teams: list[TeamUsage]


def _utc(moment: datetime) -> datetime:
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def _window(
    start: datetime | None, end: datetime | None, by: Bucket, now: datetime
) -> tuple[datetime, datetime]:
    window_end = _utc(end) if end is not None else now
    window_start = _utc(start) if start is not None else window_end - timedelta(days=DEFAULT_DAYS)
    if window_start >= window_end:
        raise ProblemError(422, "invalid-window", "`from` must be before `to`")
    step = timedelta(days=1 if by == "day" else 7)
    if (window_end - period_start(window_start, by)) / step > MAX_PERIODS:
        raise ProblemError(422, "invalid-window", f"the window spans more than {MAX_PERIODS} {by}s")
    # The last bucket must end within datetime's range.
    period_start(window_end, by) + step
    return window_start, window_end


@router.get(
    "",
    operation_id="getUsage",
    summary="GPU-hours allocated and used per team, GPU type and day or week",
)
async def get_usage(
    caller: Caller,
    models: Models,
    team: Annotated[str | None, Query(max_length=64, description="one team only")] = None,
    start: Annotated[
        datetime | None,
        Query(alias="from", description="window start, ISO 8601 (default: 30 days before `to`)"),
    ] = None,
    end: Annotated[
        datetime | None, Query(alias="to", description="window end, ISO 8601 (default: now)")
    ] = None,
    by: Annotated[Bucket, Query(description="bucket size")] = "day",
) -> UsageReport:
    if team is not None:
        caller.require_team(team)
        if team not in models.teams:
            # As GET /v1/teams/{team}: a made-up row of zeros hid a misspelt name.
            raise not_found(f"team {team}")
    elif not caller.is_admin:
        team = caller.team
    now = datetime.now(UTC)
    try:
        window_start, window_end = _window(start, end, by, now)
    except OverflowError as error:
        raise ProblemError(422, "invalid-window", "the window is out of range") from error
    teams = None if team is None else {team}
    rows = report(models.usage, start=window_start, end=window_end, by=by, now=now, teams=teams)
    hours = (window_end - window_start).total_seconds() / 3600
    names = sorted(teams if teams is not None else set(models.teams) | {row.team for row in rows})
    summary = []
    for name in names:
        queue = models.queues.get(name)
        guaranteed = queue.guaranteed_gpus if queue is not None else 0
        ceiling = queue.max_gpus if queue is not None else None
        mine = [row for row in rows if row.team == name]
        summary.append(
            TeamUsage(
                team=name,
                guaranteed_gpus=guaranteed,
                max_gpus=ceiling,
                guaranteed_gpu_hours=round(guaranteed * hours, 6),
                max_gpu_hours=None if ceiling is None else round(ceiling * hours, 6),
                allocated_gpu_hours=round(sum(r.allocated_gpu_hours for r in mine), 6),
                used_gpu_hours=round(sum(r.used_gpu_hours for r in mine), 6),
                allocated_cpu_hours=round(sum(r.allocated_cpu_hours for r in mine), 6),
                max_cpus=queue.max_cpus if queue is not None else None,
                max_memory_mb=queue.max_memory_mb if queue is not None else None,
            )
        )
    return UsageReport(
        start=window_start,
        end=window_end,
        by=by,
        items=[
            UsageItem(
                team=row.team,
                gpu_type=row.gpu_type,
                period_start=row.period_start,
                period_end=row.period_end,
                allocated_gpu_hours=row.allocated_gpu_hours,
                used_gpu_hours=row.used_gpu_hours,
                allocated_cpu_hours=row.allocated_cpu_hours,
            )
            for row in rows
        ],
        teams=summary,
    )
