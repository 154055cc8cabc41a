"""Retry backoff: how long a failed gang waits before its next attempt.

Exponential in the number of failures, capped, with jitter so that gangs failing together do
not all come back at once. The core takes no randomness it does not receive: the jitter is
drawn from the job's id and the failure count, so every replay of the log decides the same.
"""

from __future__ import annotations

import hashlib

from core.policy import SchedulingPolicy


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
