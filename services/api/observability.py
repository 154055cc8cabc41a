"""The metrics an operator's Prometheus and Grafana expect, read off the API's read models at
scrape time (nothing kept in step): jobs by state, GPUs by team and type, how fragmented the
free capacity is for what waits, queue waits per class and team, GPU time allocated, used and
lost. Names follow Prometheus' conventions: base units, `_total` for counters, labels of
bounded cardinality (teams, classes, GPU types, states, causes; never job or node ids).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime
from typing import Literal

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from schemas.jobs import JOB_STATES, WAITING_STATES
from services.api.activity import GpuActivity
from services.api.projections.model import ReadModels
from services.api.projections.usage import WAIT_BUCKETS, Interval


def unusable_free_gpus(models: ReadModels) -> tuple[int, int]:
    """(free GPUs, free GPUs no waiting job's task could use): a free GPU is usable when some
    waiting job's task fits in its node's free GPUs (of the job's GPU type, if it names one).
    With nothing waiting, nothing is counted as unusable."""
    shapes: set[tuple[int, str | None]] = {
        (job.spec.gpus_per_task, job.spec.gpu_type)
        for job in models.jobs.values()
        if job.state in WAITING_STATES and job.spec.gpus_per_task > 0
    }
    free_total = unusable = 0
    for node in models.nodes.values():
        held = {gpu for gpus in models.allocated_on(node.id).values() for gpu in gpus}
        free = sum(1 for gpu in node.healthy_gpus if gpu not in held)
        free_total += free
        if (
            free
            and shapes
            and not any(
                size <= free and gpu_type in (None, node.gpu_type) for size, gpu_type in shapes
            )
        ):
            unusable += free
    return free_total, unusable


def _gpu_seconds(intervals: list[Interval], now: datetime) -> dict[tuple[str, str], float]:
    total: dict[tuple[str, str], float] = defaultdict(float)
    for interval in intervals:
        end = interval.end or now
        total[(interval.team, interval.gpu_type)] += (
            interval.gpus * (end - interval.start).total_seconds()
        )
    return total


# Which families a collector yields: the cluster's (no team named: what `/metrics` shows
# anyone), the teams' (labelled by team: the operator's only), or both.
Part = Literal["all", "cluster", "teams"]


class ObservabilityCollector(Collector):
    def __init__(
        self,
        models: Callable[[], ReadModels | None],
        activity: Callable[[], GpuActivity | None] = lambda: None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        part: Part = "all",
    ) -> None:
        self._models = models
        self._activity = activity
        self._clock = clock
        self._part = part

    def collect(self) -> Iterator[Metric]:
        models = self._models()
        if models is None:
            return
        now = self._clock()
        if self._part != "teams":
            yield from self._jobs(models)
            yield from self._overdue(models, now)
            yield from self._free(models)
        if self._part == "cluster":
            return
        yield from self._team_jobs(models)
        yield from self._gpus(models)
        activity = self._activity()
        if activity is not None:
            yield from self._busy(models, activity, now)
        yield from self._waits(models)
        yield from self._gpu_time(models, now)

    @staticmethod
    def _jobs(models: ReadModels) -> Iterator[Metric]:
        states = Counter(job.state for job in models.jobs.values())
        gauge = GaugeMetricFamily("gangway_jobs", "Jobs by state", labels=["state"])
        for state in JOB_STATES:
            gauge.add_metric([state], states.get(state, 0))
        yield gauge

    @staticmethod
    def _team_jobs(models: ReadModels) -> Iterator[Metric]:
        counter = CounterMetricFamily(
            "gangway_preemptions",
            "Preemptions requested (checkpoint, then stop), by the victim's priority class and "
            "team and the cause (preempted for another job, node_drained, suspended, "
            "max_runtime)",
            labels=["priority", "team", "reason"],
        )
        for (priority, team, cause), count in sorted(models.usage.preemptions.items()):
            counter.add_metric([priority, team, cause], count)
        yield counter
        counter = CounterMetricFamily(
            "gangway_requeues",
            "Gangs released back to the queue, by team and requeue code (preempted, "
            "node_drained, node_lost, gpu_unhealthy, task_failed …)",
            labels=["team", "reason"],
        )
        for (team, code), count in sorted(models.usage.requeues.items()):
            counter.add_metric([team, code], count)
        yield counter

    @staticmethod
    def _overdue(models: ReadModels, now: datetime) -> Iterator[Metric]:
        """Waiting jobs whose estimated start (their reservation's plan) has passed: an
        estimate that keeps slipping is what the alert on jobs pending far past their estimate
        watches. One series per class that has waiting jobs, 0 when none is late."""
        late: Counter[str] = Counter()
        longest: dict[str, float] = {}
        for job in models.jobs.values():
            if job.state not in WAITING_STATES:
                continue
            longest.setdefault(job.priority, 0.0)
            if job.estimated_start is not None and job.estimated_start < now:
                late[job.priority] += 1
                behind = (now - job.estimated_start).total_seconds()
                longest[job.priority] = max(longest[job.priority], behind)
        count = GaugeMetricFamily(
            "gangway_pending_past_estimate_jobs",
            "Waiting jobs whose estimated start has passed, by priority class",
            labels=["priority"],
        )
        seconds = GaugeMetricFamily(
            "gangway_pending_past_estimate_seconds",
            "How far the most overdue waiting job is past its estimated start, by priority class",
            labels=["priority"],
        )
        for priority in sorted(longest):
            count.add_metric([priority], late.get(priority, 0))
            seconds.add_metric([priority], round(longest[priority], 3))
        yield count
        yield seconds

    @staticmethod
    def _gpus(models: ReadModels) -> Iterator[Metric]:
        by_team: Counter[tuple[str, str]] = Counter()
        for node_id, held in models.allocations.items():
            node = models.nodes.get(node_id)
            gpu_type = node.gpu_type if node is not None else "unknown"
            for job_id, gpus in held.items():
                job = models.jobs.get(job_id)
                by_team[(job.spec.team if job else "unknown", gpu_type)] += len(gpus)
        gauge = GaugeMetricFamily(
            "gangway_team_gpus_allocated",
            "GPUs bound to a team's gangs, by team and GPU type",
            labels=["team", "gpu_type"],
        )
        for (team, gpu_type), count in sorted(by_team.items()):
            gauge.add_metric([team, gpu_type], count)
        yield gauge

    @staticmethod
    def _free(models: ReadModels) -> Iterator[Metric]:
        free, unusable = unusable_free_gpus(models)
        gauge = GaugeMetricFamily(
            "gangway_gpus_free_unusable",
            "Free GPUs that no waiting job's task can use (fragmentation)",
        )
        gauge.add_metric([], unusable)
        yield gauge
        gauge = GaugeMetricFamily(
            "gangway_gpus_free_unusable_ratio",
            "Share of free GPUs that no waiting job's task can use",
        )
        gauge.add_metric([], round(unusable / free, 6) if free else 0.0)
        yield gauge

    @staticmethod
    def _busy(models: ReadModels, activity: GpuActivity, now: datetime) -> Iterator[Metric]:
        """Allocated GPUs' real use, by team and GPU type: the sum of the sampled GPUs' NVML
        utilization, and its ratio to the GPUs sampled; likewise their SM activity (NVML GPM)
        where the GPUs report it."""
        busy: dict[tuple[str, str], float] = defaultdict(float)
        sampled: Counter[tuple[str, str]] = Counter()
        sm_active: dict[tuple[str, str], float] = defaultdict(float)
        sm_sampled: Counter[tuple[str, str]] = Counter()
        for node_id, held in models.allocations.items():
            node = models.nodes.get(node_id)
            gpu_type = node.gpu_type if node is not None else "unknown"
            for job_id, gpus in held.items():
                job = models.jobs.get(job_id)
                key = (job.spec.team if job else "unknown", gpu_type)
                for gpu in gpus:
                    used = activity.utilization(node_id, gpu, now)
                    if used is not None:
                        busy[key] += used
                        sampled[key] += 1
                    active = activity.sm_activity(node_id, gpu, now)
                    if active is not None:
                        sm_active[key] += active
                        sm_sampled[key] += 1
        yield from _summed_and_mean(
            ("gangway_team_gpus_busy",
             "Allocated GPUs' NVML utilization summed (1 = one GPU fully busy), by team and type"),
            ("gangway_team_gpu_utilization_ratio",
             "Used over allocated: mean NVML utilization of a team's allocated GPUs"),
            busy, sampled,
        )  # fmt: skip
        yield from _summed_and_mean(
            ("gangway_team_gpus_sm_active",
             "Allocated GPUs' SM activity (NVML GPM) summed (1 = every SM of one GPU busy), "
             "by team and GPU type"),
            ("gangway_team_gpu_sm_active_ratio",
             "Mean share of SMs busy (NVML GPM) on a team's allocated GPUs that report it"),
            sm_active, sm_sampled,
        )  # fmt: skip

    @staticmethod
    def _waits(models: ReadModels) -> Iterator[Metric]:
        histogram = HistogramMetricFamily(
            "gangway_queue_wait_seconds",
            "Time from waiting (submitted or requeued) to the gang's reservation",
            labels=["priority", "team"],
        )
        for (priority, team), waits in sorted(models.usage.waits.items()):
            cumulative, buckets = 0, []
            for bound, count in zip((*WAIT_BUCKETS, float("inf")), waits.counts, strict=True):
                cumulative += count
                buckets.append(("+Inf" if bound == float("inf") else f"{bound:.1f}", cumulative))
            histogram.add_metric([priority, team], buckets, waits.total_s)
        yield histogram

    @staticmethod
    def _gpu_time(models: ReadModels, now: datetime) -> Iterator[Metric]:
        for name, help_text, intervals in (
            (
                "gangway_gpu_allocated_seconds",
                "GPU-seconds allocated to gangs, by team and GPU type",
                models.usage.allocated,
            ),
            (
                "gangway_gpu_used_seconds",
                "GPU-seconds while every rank of the gang ran, by team and GPU type",
                models.usage.used,
            ),
        ):
            counter = CounterMetricFamily(name, help_text, labels=["team", "gpu_type"])
            for (team, gpu_type), seconds in sorted(_gpu_seconds(intervals, now).items()):
                counter.add_metric([team, gpu_type], seconds)
            yield counter
        lost = CounterMetricFamily(
            "gangway_lost_gpu_seconds",
            "GPU-seconds of work since the last checkpoint thrown away when an attempt ended "
            "early, by team and cause (preempted, node_lost, failed …)",
            labels=["team", "cause"],
        )
        for (team, cause), seconds in sorted(models.usage.lost_gpu_seconds.items()):
            lost.add_metric([team, cause], seconds)
        yield lost


def _summed_and_mean(
    summed: tuple[str, str],
    mean: tuple[str, str],
    totals: Mapping[tuple[str, str], float],
    samples: Mapping[tuple[str, str], int],
) -> Iterator[Metric]:
    """A per-(team, GPU type) reading as two gauges: its sum over the sampled GPUs, and its mean."""
    total = GaugeMetricFamily(*summed, labels=["team", "gpu_type"])
    average = GaugeMetricFamily(*mean, labels=["team", "gpu_type"])
    for key, count in sorted(samples.items()):
        total.add_metric(list(key), round(totals[key], 6))
        average.add_metric(list(key), round(totals[key] / count, 6))
    yield total
    yield average
