"""What the scheduler reports to Prometheus."""

from __future__ import annotations

from collections import Counter as Tally
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from core.state import SchedulerState
from schemas.jobs import WAITING_STATES
from services.runtime.metrics import ConsumerLag, FollowerMetrics


@dataclass(frozen=True)
class SchedulerMetrics:
    follower: FollowerMetrics
    cycle_seconds: Histogram
    decisions: Counter
    conflicts: Counter
    pending_jobs: Gauge
    gpus_allocated: Gauge
    gpus_total: Gauge
    leader_epoch: Gauge
    is_leader: Gauge
    consumer_lag: ConsumerLag

    @classmethod
    def create(cls, registry: CollectorRegistry) -> SchedulerMetrics:
        follower = FollowerMetrics.create("scheduler", registry)
        # The scheduler folds the log from PostgreSQL; its lag is the same events-behind-head
        # figure as gangway_scheduler_lag_events, under the name every service reports.
        consumer_lag = ConsumerLag("scheduler", registry)
        consumer_lag.watch("events", lambda: _gauge_value(follower.lag_events))
        return cls(
            follower=follower,
            consumer_lag=consumer_lag,
            cycle_seconds=Histogram(
                "gangway_scheduler_cycle_seconds",
                "Time of one scheduling cycle (the core's schedule call)",
                buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
                registry=registry,
            ),
            decisions=Counter(
                "gangway_scheduler_decisions",
                "Events the scheduler appended, by type",
                ("type",),
                registry=registry,
            ),
            conflicts=Counter(
                "gangway_scheduler_append_conflicts",
                "Cycles re-run because a stream moved between fold and append",
                registry=registry,
            ),
            pending_jobs=Gauge(
                "gangway_scheduler_pending_jobs",
                "Jobs waiting for a gang, by priority class",
                ("priority",),
                registry=registry,
            ),
            gpus_allocated=Gauge(
                "gangway_scheduler_gpus_allocated", "GPUs bound to gangs", registry=registry
            ),
            gpus_total=Gauge(
                "gangway_scheduler_gpus_total",
                "GPUs of registered nodes that are not lost",
                registry=registry,
            ),
            leader_epoch=Gauge(
                "gangway_scheduler_leader_epoch",
                "The epoch this replica leads at (0 while it stands by)",
                registry=registry,
            ),
            is_leader=Gauge(
                "gangway_scheduler_is_leader",
                "1 on the active leader, 0 on standbys",
                registry=registry,
            ),
        )

    def observe_state(self, state: SchedulerState) -> None:
        """Gauges read off the state; walks every job, so called on a slow timer."""
        pending = Tally(view.priority for view in state.jobs() if view.state in WAITING_STATES)
        for pc in state.policy.priority_classes:
            self.pending_jobs.labels(pc.name).set(pending.get(pc.name, 0))
        self.gpus_allocated.set(float(state.allocated_gpus))
        self.gpus_total.set(state.total_gpus)


def _gauge_value(gauge: Gauge) -> float:
    return float(next(iter(gauge.collect())).samples[0].value)
