"""A gang on its way out leaves its queue's usage once per cycle (core/preemption.py,
credit_leaving): counted in full, its team looked like a borrower; credited once per phase
(the priority planner, then fairness, then each fairness preemptor), its team looked further
within its guarantee than it is, and fairness made it borrow."""

from __future__ import annotations

from schemas.jobs import PreemptionRequested
from tests.core.builders import History, a_job
from tests.core.test_fairness import FAIR


def test_a_suspended_gang_is_credited_to_its_team_once_not_once_per_phase() -> None:
    # Team alpha is guaranteed 8 GPUs and uses 16: a long 8-GPU gang (a level above the
    # waiting job's) and two young 4-GPU gangs; n0002 is another team's. One 4-GPU gang is
    # suspended this cycle: alpha uses 12 once it is gone. An 8-GPU job of alpha waits:
    # evicting the long gang for it would leave alpha at 12 GPUs, beyond its guarantee, so
    # fairness evicts no one. Credited twice, the suspended gang made it look like 8.
    history = History("3x8:3:1", policy=FAIR).team("alpha", guaranteed=8)
    history.occupy("n0002", 8)
    long = history.submit(a_job().gpus(8).team("alpha"))[0]
    history.run()
    history.advance(1200)
    leaving, _ = history.submit(*(a_job().gpus(4).team("alpha") for _ in range(2)))
    history.run()
    history.advance(60)
    history.suspend(leaving)
    waiting = history.submit(a_job().gpus(8).team("alpha"))[0]

    history.cycle()

    assert [p.job_id for p in history.events(PreemptionRequested)] == [leaving]
    assert history.job(long).state == "running"
    assert history.job(waiting).reason_code == "reserved_head"
