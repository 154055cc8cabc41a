"""A preemptor that waits for several victims finds the GPUs its first victims freed still
there when its last one leaves (core/backfill.py `_hold_for_reclaim`): they were freed for it,
by evictions its plan chose, and nobody else may take them in the meantime, not even a job
ahead of it in line (an aged job, which could not have evicted them itself)."""

from __future__ import annotations

from core import SchedulingPolicy
from schemas.jobs import GangReserved, PreemptionRequested
from tests.core.builders import History, a_job

AGING_S = 600.0


def test_the_gpus_a_first_victim_freed_wait_for_its_preemptor_not_for_an_aged_job() -> None:
    history = History("1x8:1:1", policy=SchedulingPolicy(aging_max_wait_s=AGING_S))
    first, last = history.submit(*(a_job().gpus(4).team("beta").estimate(86400) for _ in range(2)))
    history.run()
    aged = history.submit(a_job().gpus(4).team("alpha").estimate(3600))[0]
    history.advance(AGING_S)
    history.run()  # the aged job waits ahead of everyone; research, it evicts nobody
    urgent = history.submit(a_job().gpus(8).team("gamma").priority("production"))[0]
    history.run()
    assert {p.job_id for p in history.events(PreemptionRequested)} == {first, last}
    assert {p.preemptor_job_id for p in history.events(PreemptionRequested)} == {urgent}

    history.evict(first)
    history.run(cycles=3)  # the last victim still checkpoints

    assert history.events(GangReserved, aged) == []
    history.evict(last)
    history.run()
    assert history.job(urgent).state == "running"
    assert history.bound_gpus(urgent) == 8
    assert [p.preemptor_job_id for p in history.events(PreemptionRequested)] == [urgent] * 2
    assert history.auditor.violations == []
