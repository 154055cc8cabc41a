"""Showback: GPU-hours allocated and used per team and GPU type, folded from the log.

Two kinds of interval per job attempt, both read off the job read model's transitions (so the
book is exactly as reproducible by replay as the job records are):

- allocated: from the gang's reservation (the job starts holding GPUs) until it lets them go
  (requeued, suspended, finished): the GPUs were the team's, whatever ran on them;
- used: while every rank of the gang runs (state `running`, and `preempting` once all had
  started): the GPUs were running the team's code.

Beside them, what the metrics report (services/api/observability.py): queue waits (from the
moment a job waits, submitted or requeued, to its gang's reservation) per priority class and
team, and GPU-seconds of work lost when an attempt ends before its end (requeued, failed): the
time its ranks ran since its last committed checkpoint.

Raw utilization (NVML) is telemetry, never in the log; it is a Prometheus series instead
(docs/observability.md). `report` cuts the intervals into day or week buckets (UTC, weeks from
Monday) over a window; an interval still open counts up to `now`, which the caller passes in.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from itertools import chain
from typing import Literal

from core.live_sharing import GpuAmount, job_gpus, placement_gpus
from schemas.jobs import WAITING_STATES
from services.api.projections.jobs import JobReadModel

Bucket = Literal["day", "week"]


@dataclass(slots=True)
class Interval:
    job_id: str
    team: str
    gpu_type: str
    # Exact: a 1g slice of an H100 is 1/7 of a GPU, a 0.25 share 1/4.
    gpus: GpuAmount
    start: datetime
    end: datetime | None = None
    # The CPUs its ranks on nodes of this GPU type asked (CPU-only gangs hold CPUs, no GPU).
    cpus: float = 0.0


@dataclass(frozen=True, slots=True)
class UsageRow:
    team: str
    gpu_type: str
    period_start: datetime
    period_end: datetime
    allocated_gpu_hours: float
    used_gpu_hours: float
    allocated_cpu_hours: float = 0.0


def _uses(job: JobReadModel | None) -> bool:
    if job is None:
        return False
    return job.state == "running" or (
        job.state == "preempting" and bool(job.gang_ranks) and job.gang_ranks <= job.started_ranks
    )


def _holds(job: JobReadModel | None) -> bool:
    return job is not None and job.holds_gpus


# Why a gang was asked to checkpoint and stop, in the requeue codes' words where one fits:
# a closed set for a metric's label, read off the scheduler's stable wording of the reason.
PREEMPTION_CAUSES: tuple[tuple[str, str], ...] = (
    ("preempted for job", "preempted"),
    ("is draining", "node_drained"),
    ("suspended by request", "suspended"),
    ("max_runtime", "max_runtime"),
)


def preemption_cause(reason: str | None) -> str:
    text = reason or ""
    return next((cause for marker, cause in PREEMPTION_CAUSES if marker in text), "other")


# Queue wait histogram buckets, seconds: a minute to a week.
WAIT_BUCKETS: tuple[float, ...] = (
    1,
    10,
    30,
    60,
    300,
    900,
    1800,
    3600,
    4 * 3600,
    12 * 3600,
    86400,
    3 * 86400,
    7 * 86400,
)


@dataclass(slots=True)
class WaitHistogram:
    """Cumulative-ready counts per upper bound (the last is +Inf), the sum and the count."""

    counts: list[int] = field(default_factory=lambda: [0] * (len(WAIT_BUCKETS) + 1))
    total_s: float = 0.0

    def observe(self, seconds: float) -> None:
        # The first bound at or above `seconds` (the bounds ascend); past the last, +Inf's.
        index = bisect_left(WAIT_BUCKETS, seconds)
        self.counts[index] += 1
        self.total_s += seconds

    @property
    def count(self) -> int:
        return sum(self.counts)


@dataclass(slots=True)
class UsageBook:
    allocated: list[Interval] = field(default_factory=list)
    used: list[Interval] = field(default_factory=list)
    # (priority class, team) -> how long jobs waited for their gang.
    waits: dict[tuple[str, str], WaitHistogram] = field(default_factory=dict)
    # (team, cause: the requeue code, or `failed`) -> GPU-seconds of work since the last
    # committed checkpoint, thrown away when an attempt ended early.
    lost_gpu_seconds: dict[tuple[str, str], float] = field(default_factory=dict)
    # (priority class, team, cause) -> preemptions requested (checkpoint, then stop).
    preemptions: dict[tuple[str, str, str], int] = field(default_factory=dict)
    # (team, requeue code) -> gangs released back to the queue.
    requeues: dict[tuple[str, str], int] = field(default_factory=dict)
    # The same intervals by team: a team's report walks its own intervals only, however many
    # the other teams have (the index every team's GET /v1/usage reads).
    allocated_by_team: dict[str, list[Interval]] = field(default_factory=dict)
    used_by_team: dict[str, list[Interval]] = field(default_factory=dict)
    # job id -> its open intervals (one per GPU type of its placement).
    _open_allocated: dict[str, list[Interval]] = field(default_factory=dict)
    _open_used: dict[str, list[Interval]] = field(default_factory=dict)
    _waiting_since: dict[str, datetime] = field(default_factory=dict)
    # job id -> (attempt, time) of its latest committed checkpoint.
    _checkpointed: dict[str, tuple[int, datetime]] = field(default_factory=dict)

    def holding_since(self, job_id: str) -> datetime | None:
        """When the job's current gang was reserved; None when it holds none."""
        intervals = self._open_allocated.get(job_id)
        return intervals[0].start if intervals else None

    def checkpointed(self, job_id: str, attempt: int, at: datetime) -> None:
        self._checkpointed[job_id] = (attempt, at)

    def observe(
        self,
        before: JobReadModel | None,
        after: JobReadModel,
        at: datetime,
        gpu_type_of: Callable[[str], str | None],
    ) -> None:
        """Open or close the job's intervals on the transition `before` → `after` at `at`."""
        self._account_wait(before, after, at)
        self._account_evictions(before, after)
        if _uses(before) and not _holds(after):
            self._account_loss(after, at)
        self._step(
            self.allocated,
            self.allocated_by_team,
            self._open_allocated,
            _holds(before),
            _holds(after),
            after,
            at,
            gpu_type_of,
        )
        self._step(
            self.used,
            self.used_by_team,
            self._open_used,
            _uses(before),
            _uses(after),
            after,
            at,
            gpu_type_of,
        )

    def intervals(
        self, kind: Literal["allocated", "used"], teams: set[str] | None
    ) -> Iterable[Interval]:
        """The `kind` intervals of `teams` (None: every team's), through the team index."""
        if teams is None:
            return self.allocated if kind == "allocated" else self.used
        index = self.allocated_by_team if kind == "allocated" else self.used_by_team
        return chain.from_iterable(index.get(team, ()) for team in sorted(teams))

    def _account_wait(self, before: JobReadModel | None, after: JobReadModel, at: datetime) -> None:
        waited = before is not None and before.state in WAITING_STATES
        if after.state in WAITING_STATES:
            if not waited:
                self._waiting_since[after.id] = at
            return
        since = self._waiting_since.pop(after.id, None)
        if since is not None and _holds(after):
            key = (after.priority, after.spec.team)
            waits = self.waits.get(key)
            if waits is None:  # not setdefault: it built a histogram for every reservation
                waits = self.waits[key] = WaitHistogram()
            waits.observe((at - since).total_seconds())

    def _account_evictions(self, before: JobReadModel | None, after: JobReadModel) -> None:
        if before is None:
            return
        if after.preemptions > before.preemptions:
            key = (after.priority, after.spec.team, preemption_cause(after.reason))
            self.preemptions[key] = self.preemptions.get(key, 0) + 1
        if after.state == "queued" and _holds(before) and after.reason_code:
            requeue = (after.spec.team, after.reason_code)
            self.requeues[requeue] = self.requeues.get(requeue, 0) + 1

    def _account_loss(self, after: JobReadModel, at: datetime) -> None:
        if after.state == "succeeded":
            return
        cause = "failed" if after.state == "failed" else (after.reason_code or after.state)
        if after.state in ("cancelled", "suspended"):
            return  # asked for by a person: not lost by the system
        ran_since = min((i.start for i in self._open_used.get(after.id, [])), default=at)
        attempt, checkpoint_at = self._checkpointed.get(after.id, (0, ran_since))
        since = max(ran_since, checkpoint_at) if attempt == after.attempt else ran_since
        seconds = max(0.0, (at - since).total_seconds()) * float(job_gpus(after.spec))
        key = (after.spec.team, cause)
        self.lost_gpu_seconds[key] = self.lost_gpu_seconds.get(key, 0.0) + seconds

    @staticmethod
    def _step(
        book: list[Interval],
        by_team: dict[str, list[Interval]],
        open_now: dict[str, list[Interval]],
        was: bool,
        now: bool,
        job: JobReadModel,
        at: datetime,
        gpu_type_of: Callable[[str], str | None],
    ) -> None:
        if was and not now:
            for interval in open_now.pop(job.id, []):
                interval.end = at
        elif now and not was:
            by_type: dict[str, GpuAmount] = defaultdict(int)
            cpus_by_type: dict[str, float] = defaultdict(float)
            cpus = job.spec.cpus_per_task or 0.0
            if job.ranks:
                for rank in job.ranks:
                    kind = gpu_type_of(rank.node_id) or job.spec.gpu_type or "unknown"
                    by_type[kind] += placement_gpus(rank)
                    cpus_by_type[kind] += cpus
            else:
                for node, gpus in job.placement.items():
                    by_type[gpu_type_of(node) or job.spec.gpu_type or "unknown"] += len(gpus)
            intervals = [
                Interval(job.id, job.spec.team, gpu_type, count, at, cpus=cpus_by_type[gpu_type])
                for gpu_type, count in sorted(by_type.items())
            ]
            book.extend(intervals)
            by_team.setdefault(job.spec.team, []).extend(intervals)
            open_now[job.id] = intervals


def period_start(moment: datetime, by: Bucket) -> datetime:
    day = moment.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    return day if by == "day" else day - timedelta(days=day.weekday())


def _step_of(by: Bucket) -> timedelta:
    return timedelta(days=1 if by == "day" else 7)


def _spread(
    intervals: Iterable[Interval],
    start: datetime,
    end: datetime,
    by: Bucket,
    now: datetime,
    teams: set[str] | None,
    amount: Callable[[Interval], float] = lambda interval: float(interval.gpus),
) -> dict[tuple[str, str, datetime], float]:
    """GPU-hours (or another `amount`'s hours) per (team, gpu type, period) of the intervals,
    clipped to [start, end)."""
    hours: dict[tuple[str, str, datetime], float] = defaultdict(float)
    step = _step_of(by)
    for interval in intervals:
        if teams is not None and interval.team not in teams:
            continue
        low = max(interval.start, start)
        high = min(interval.end or now, end)
        period = period_start(low, by)
        while low < high:
            boundary = min(period + step, high)
            hours[(interval.team, interval.gpu_type, period)] += (
                amount(interval) * (boundary - low).total_seconds() / 3600
            )
            low, period = boundary, period + step
    return hours


def report(
    book: UsageBook,
    *,
    start: datetime,
    end: datetime,
    by: Bucket,
    now: datetime,
    teams: set[str] | None = None,
) -> list[UsageRow]:
    """Rows per (team, GPU type, period) with any allocation in [start, end), in that order.
    With `teams`, it walks only their intervals (the book's team index)."""
    allocated = _spread(book.intervals("allocated", teams), start, end, by, now, teams)
    used = _spread(book.intervals("used", teams), start, end, by, now, teams)
    cpu_hours = _spread(
        book.intervals("allocated", teams), start, end, by, now, teams, lambda i: i.cpus
    )
    step = _step_of(by)
    return [
        UsageRow(
            team=team,
            gpu_type=gpu_type,
            period_start=period,
            period_end=period + step,
            allocated_gpu_hours=round(hours, 6),
            used_gpu_hours=round(used.get((team, gpu_type, period), 0.0), 6),
            allocated_cpu_hours=round(cpu_hours.get((team, gpu_type, period), 0.0), 6),
        )
        for (team, gpu_type, period), hours in sorted(allocated.items())
    ]
