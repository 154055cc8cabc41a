"""A preemptor that waits for several victims finds the GPUs its first victims freed still
there when its last one leaves (core/backfill.py `_hold_for_reclaim`): they were freed for it,
by evictions its plan chose, and nobody else may take them in the meantime, not even a job
ahead of it in line (an aged job, which could not have evicted them itself)."""

from __future__ import annotations

from core import SchedulingPolicy
from schemas.jobs import GangReserved, PreemptionRequested
from tests.core.builders import History, JobBuilder, a_job

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


def test_a_second_preemptor_whose_plan_needs_the_gpus_held_for_the_first_waits() -> None:
    """P1 (two ranks of 4) evicts one gang on each node and holds the 4 GPUs the first freed.
    P2 (8 GPUs on one node) could land on those 4 and its victim Z's beside them: it evicted
    Z, then P1, first in line, landed on all 8 (Z's too) and P2 fit nowhere, Z evicted for
    nothing. A plan that needs GPUs held for another preemptor waits until it has landed."""
    history = History("2x8:2:1")
    history.team("alpha").team("beta")
    borrowed = a_job().team("beta").priority("research").estimate(86400)
    first = history.occupy("n0000", 4, borrowed)
    last = history.occupy("n0001", 4, a_job().team("beta").priority("research").estimate(86400))
    history.occupy("n0001", 4)  # not preemptible
    young = a_job().team("beta").priority("research").estimate(86400).min_runtime(60)
    beside = history.occupy("n0000", 4, young)
    history.advance(10)
    p1 = history.submit(a_job().team("alpha").priority("production").gpus(4).tasks(2))[0]
    history.run()
    assert {p.job_id for p in history.events(PreemptionRequested)} == {first, last}
    history.evict(first)
    history.run(every_s=70)  # P1 holds the 4 GPUs of n0000 its first victim freed
    p2 = history.submit(a_job().team("alpha").priority("production").gpus(8))[0]

    history.run()

    assert [p.job_id for p in history.events(PreemptionRequested, beside)] == []
    history.evict(last)
    history.run(cycles=2)
    assert history.job(p1).state == "running"
    assert history.job(beside).state == "running"
    assert history.job(p2).state == "queued"
    assert history.auditor.violations == []


def test_a_preemptor_waits_for_held_gpus_rather_than_evict_its_own_queues_gangs() -> None:
    """Borrowers first: P2 (alpha) could land on the 4 GPUs held for P1 and borrower B's 4.
    The held GPUs promised, it does not evict its own queue's R1 and R2 instead (the auditor's
    borrowers_first rule, which counts held GPUs as idle, would rightly object): it waits,
    and once P1 has landed (no borrower left that makes room) it evicts them."""
    history = History("3x8:3:1")
    history.team("alpha", guaranteed=8).team("beta").team("gamma")

    def beta() -> JobBuilder:
        return a_job().team("beta").priority("research").estimate(86400)

    def alpha() -> JobBuilder:
        return a_job().team("alpha").priority("research").estimate(86400).preemptible(True)

    first = history.occupy("n0000", 4, beta())
    history.occupy("n0000", 4, beta().min_runtime(60))
    last = history.occupy("n0001", 4, beta())
    history.occupy("n0001", 4)  # not preemptible
    own = [history.occupy("n0002", 4, alpha()), history.occupy("n0002", 4, alpha())]
    history.advance(10)
    p1 = history.submit(a_job().team("gamma").priority("production").gpus(4).tasks(2))[0]
    history.run()
    assert {p.job_id for p in history.events(PreemptionRequested)} == {first, last}
    history.evict(first)
    history.run(every_s=70)
    p2 = history.submit(a_job().team("alpha").priority("production").gpus(8))[0]

    history.run()

    assert [p.preemptor_job_id for p in history.events(PreemptionRequested)] == [p1] * 2
    history.evict(last)
    history.run(cycles=2)
    assert history.job(p1).state == "running"
    evicted = [p.job_id for p in history.events(PreemptionRequested) if p.preemptor_job_id == p2]
    assert sorted(evicted) == sorted(own)
    assert history.auditor.violations == []
