"""Retries: how long a failed gang waits before its next attempt, and when it gets none.

Exponential in the number of failures, capped, with jitter so that gangs failing together do
not all come back at once. The core takes no randomness it does not receive: the jitter is
drawn from the job's id and the failure count, so every replay of the log decides the same.
A failure that would repeat (an out-of-memory exit at a size that already ran out) is
permanent: the job fails at once instead of waiting out its retries.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection

from core.policy import SchedulingPolicy
from schemas.jobs import JobSpec


def jitter_fraction(job_id: str, failures: int) -> float:
    """A number in [0, 1) fixed by (job, failure count), spread like a uniform draw."""
    digest = hashlib.sha256(f"{job_id}:{failures}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


def retry_delay_s(job_id: str, failures: int, policy: SchedulingPolicy) -> float:
    """The wait after the `failures`-th failure: base·2^(failures-1), capped, then between
    half and all of it ("equal jitter"). 0 when backoff is off or nothing failed yet."""
    if failures <= 0 or policy.retry_backoff_base_s <= 0:
        return 0.0
    ceiling = min(policy.retry_backoff_cap_s, policy.retry_backoff_base_s * 2.0 ** (failures - 1))
    return ceiling / 2 + ceiling / 2 * jitter_fraction(job_id, failures)


# --------------------------------------------------------------------------- out of memory

# The spec's fields that size each task of an attempt: what a user changes to give a task more
# memory. Fields a spec of this version lacks are simply not part of the size.
SIZE_FIELDS = frozenset(
    {
        "gpu_type",
        "gpus_per_task",
        "mig_profile",
        "gpu_fraction",
        "gpu_memory_mb",
        "cpus_per_task",
        "memory_mb_per_task",
    }
)
# Out of memory in this many attempts of the same size: the next would be too.
OOM_ATTEMPTS_BEFORE_PERMANENT = 2
# Gangs of one job lost in a row when their agent restarted, each soon after it started (within
# the policy's hysteresis window), that spend no retry (core/reactions.py `react_to_gang`);
# past them each such loss spends one, as a rank's failure does, with its backoff, and its
# reclaim keeps its calm. An agent that restarts under the job every time (a
# launch that crashes it, a node whose agent restarts in a loop) otherwise requeued it at once
# without end, each time reclaiming from gangs never preempted: a preempt/resume storm.
FREE_AGENT_RESTARTS = 3


def attempt_size(spec: JobSpec, ranks: int) -> str:
    """The size of an attempt as far as its memory goes, worded for a person: how many ranks
    its gang has and what each task was given (`2 ranks of gpus_per_task=8`)."""
    given = spec.model_dump(include=set(SIZE_FIELDS), exclude_none=True)
    each = ", ".join(f"{name}={value}" for name, value in sorted(given.items()))
    return f"{ranks} rank{'' if ranks == 1 else 's'} of {each}"


def repeated_oom(size: str, attempts: Collection[int]) -> str | None:
    """Why a gang that ran out of memory is not retried, or None while a retry may help.

    The first out-of-memory exit is retried: memory use may depend on the data reached, on a
    neighbour's page cache, on a leak that a restart clears. A second one at the same size
    shows that the job needs more than it asks for: retrying would only run out again, so the
    job fails at once with the reason, and its owner resubmits it larger.
    """
    if len(attempts) < OOM_ATTEMPTS_BEFORE_PERMANENT:
        return None
    shown = " and ".join(str(a) for a in sorted(attempts)[-OOM_ATTEMPTS_BEFORE_PERMANENT:])
    return (
        f"ran out of memory again at the same size ({size}): attempts {shown} were killed "
        "by the kernel's OOM killer; not retried: it would run out again "
        "(give each task more memory)"
    )
