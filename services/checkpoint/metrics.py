"""What the checkpoint service reports to Prometheus: outcomes, how long a checkpoint takes
from its request to its verdict, how big a committed one is, the storage each team holds, and
how far its consumer trails the log.

Durations and sizes are labelled by what asked for the checkpoint (`trigger`: periodic, an
eviction, any other request), a closed set; never by job or team, whose number has no bound
worth a histogram's buckets each.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from schemas.checkpoints import CheckpointRequested
from schemas.jobs import PreemptionRequested
from services.runtime.metrics import ConsumerLag

TRIGGERS = ("periodic", "eviction", "requested")
# From a second (a small model's shards on local disk) to an hour (terabytes to remote storage).
DURATION_BUCKETS = (1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1200, 1800, 3600)
# From a megabyte to ten terabytes, by powers of four.
SIZE_BUCKETS = tuple(float(1 << (20 + 2 * k)) for k in range(13))


def trigger_of(request: CheckpointRequested | PreemptionRequested) -> str:
    if isinstance(request, PreemptionRequested):
        return "eviction"
    return "periodic" if request.reason == "periodic" else "requested"


@dataclass(frozen=True)
class CheckpointMetrics:
    outcomes: Counter
    team_bytes: Gauge
    duration: Histogram
    size: Histogram
    consumer_lag: ConsumerLag

    @classmethod
    def create(cls, registry: CollectorRegistry) -> CheckpointMetrics:
        metrics = cls(
            outcomes=Counter(
                "gangway_checkpoint_outcomes",
                "Checkpoints by outcome",
                ["outcome"],
                registry=registry,
            ),
            team_bytes=Gauge(
                "gangway_checkpoint_bytes",
                "Checkpoint storage held, per team (as of the last sweep)",
                ["team"],
                registry=registry,
            ),
            duration=Histogram(
                "gangway_checkpoint_duration_seconds",
                "From a checkpoint's request to its commit (every shard written and verified)",
                ["trigger"],
                buckets=DURATION_BUCKETS,
                registry=registry,
            ),
            size=Histogram(
                "gangway_checkpoint_size_bytes",
                "Bytes of a committed checkpoint, every rank's shard together",
                ["trigger"],
                buckets=SIZE_BUCKETS,
                registry=registry,
            ),
            consumer_lag=ConsumerLag("checkpoint", registry),
        )
        for trigger in TRIGGERS:  # every series exists from the start, at zero
            metrics.duration.labels(trigger)
            metrics.size.labels(trigger)
        return metrics

    def committed(
        self, request: CheckpointRequested | PreemptionRequested, seconds: float, size: int
    ) -> None:
        trigger = trigger_of(request)
        self.duration.labels(trigger).observe(max(0.0, seconds))
        self.size.labels(trigger).observe(size)
