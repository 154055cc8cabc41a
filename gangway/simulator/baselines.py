"""The simulator's baselines: fifo with quotas and the clairvoyant sjf/srtf oracles.

They run through the same core as Gangway's own policy (admission, quotas, placement, the
auditor); what differs is the order of the waiting jobs, given to the core as a key of the job
id (`SchedulingPolicy.order_key`), and, for srtf-oracle, preemptions decided here. The oracles
read the trace's `duration_s`: they live in the simulator, for comparison only, so that
nothing in `core/` can ever read a job's true runtime.

All three keep the Helios study's baselines' shape: strict order with head-of-line blocking (no
backfill) and no preemption by the core. Quota ceilings are honoured: a job at its queue's
ceiling is passed over, not made the head.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Literal

from core import SchedulingPolicy
from core.policy import JobOrderKey

Baseline = Literal["fifo", "sjf-oracle", "srtf-oracle"]


@dataclass(frozen=True, slots=True)
class OrderFacts:
    """What the simulator knows of a job that a baseline may order by."""

    submit_s: float
    duration_s: float  # the trace's true runtime: oracles only
    remaining_s: float  # work left (the true runtime less what checkpoints saved)


def order_key(baseline: Baseline, facts: Callable[[str], OrderFacts]) -> JobOrderKey:
    """Arrival for fifo; true runtime for sjf-oracle; true remaining work for srtf-oracle."""

    def fifo(job_id: str) -> tuple[float, ...]:
        return (facts(job_id).submit_s,)

    def sjf(job_id: str) -> tuple[float, ...]:
        job = facts(job_id)
        return (job.duration_s, job.submit_s)

    def srtf(job_id: str) -> tuple[float, ...]:
        job = facts(job_id)
        return (job.remaining_s, job.submit_s)

    return {"fifo": fifo, "sjf-oracle": sjf, "srtf-oracle": srtf}[baseline]


def baseline_policy(base: SchedulingPolicy, key: JobOrderKey) -> SchedulingPolicy:
    """`base` ordered by `key`, strictly (no backfill), without the core's preemption."""
    return replace(base, order_key=key, backfill=False, preemption=False)


@dataclass(frozen=True, slots=True)
class Candidate:
    job_id: str
    remaining_s: float  # for a running job: what is left of its work now
    gpus: int
    running: bool
    submit_s: float


def srtf_preemptions(
    candidates: Sequence[Candidate], capacity_gpus: int
) -> tuple[list[str], str | None]:
    """Which running jobs to evict so that the shortest remaining work runs (Helios' SRTF).

    Waiting and running jobs of one group (a tenant under its ceiling, or the whole cluster)
    in order of remaining work claim the group's GPUs; a running job that no longer fits is
    evicted. Returns the victims and the shortest waiting job that claimed GPUs (the
    preemptor), or ([], None) when no waiting job displaces a running one.
    """
    left = capacity_gpus
    victims: list[str] = []
    preemptor: str | None = None
    for job in sorted(candidates, key=lambda c: (c.remaining_s, c.submit_s, c.job_id)):
        if job.gpus <= left:
            left -= job.gpus
            if not job.running and preemptor is None:
                preemptor = job.job_id
        elif job.running:
            victims.append(job.job_id)
    if not victims or preemptor is None:
        return [], None
    return victims, preemptor
