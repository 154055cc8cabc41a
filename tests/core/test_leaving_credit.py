"""A gang on its way out leaves its queue's usage once per cycle (core/preemption.py,
credit_leaving): counted in full, its team looked like a borrower; credited once per phase
(the priority planner, then fairness, then each fairness preemptor), its team looked further
within its guarantee than it is, and fairness made it borrow."""

from __future__ import annotations

from collections.abc import Set as AbstractSet

import pytest

from core.context import CycleContext
from core.preemption import credit_leaving
from core.quota import QuotaBook
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


def leaving_state() -> tuple[History, str, str]:
    """Team alpha holds two 8-GPU gangs; one is being preempted (suspended, its ranks not yet
    stopped): `preempting`, still holding its GPUs."""
    history = History("2x8:2:1").team("alpha", guaranteed=16)
    staying, leaving = history.submit(*(a_job().gpus(8).team("alpha") for _ in range(2)))
    history.run()
    history.suspend(leaving)
    history.run(agents=False)
    assert history.job(leaving).state == "preempting"
    assert history.job(staying).state == "running"
    return history, staying, leaving


def credited(
    history: History, *, handled: set[str], released: AbstractSet[str] = frozenset()
) -> float:
    """alpha's usage in a cycle's quota book (its 16 GPUs held) after the leaving gangs are
    credited: each leaving gang's GPUs come off once; a released one's were already."""
    ctx = CycleContext.start(history.state, history.now)
    ctx.handled |= handled
    ctx.released |= released
    quota = QuotaBook(history.state.queue_records)
    credit_leaving(ctx, quota)
    credit_leaving(ctx, quota)  # a second phase of the same cycle credits nothing more
    return float(quota.usage.get("alpha", 0))


def test_a_gang_being_preempted_is_credited_once_even_when_handled_again() -> None:
    history, _, leaving = leaving_state()
    assert credited(history, handled=set()) == 8
    assert credited(history, handled={leaving}) == 8


def test_a_handled_gang_is_credited_unless_released_and_a_gone_one_is_passed_over() -> None:
    history, staying, leaving = leaving_state()
    assert credited(history, handled={staying}) == 0
    assert credited(history, handled={staying}, released={staying, leaving}) == 16
    assert credited(history, handled={"no-such-job"}) == 8


@pytest.mark.xfail(
    strict=True,
    reason="open: a reclaim planned this cycle is not charged to the reclaiming queue, so a "
    "second job of the queue reclaims again in the same cycle (and in the next ones while the "
    "victims checkpoint). Charging it in the preemption phase alone makes the fairness phase "
    "and the auditor's borrowers_first rule read the queue differently (the auditor counts no "
    "arriving reclaimer): both must count what a queue reclaimed and has not landed yet",
)
def test_a_queue_reclaims_no_more_than_its_guarantee_in_one_cycle() -> None:
    # Queue q is guaranteed 4 GPUs and uses none; a lender borrows the whole node in two 4-GPU
    # gangs. Two 4-GPU jobs of q wait: q is owed 4 GPUs, so one lender gang is evicted, not two.
    history = History("1x8:1:1").team("q", guaranteed=4).team("lender")
    lent = [history.occupy("n0000", 4, a_job().team("lender").estimate(86400)) for _ in "ab"]
    history.advance(600)
    history.submit(*(a_job().gpus(4).team("q").estimate(3600) for _ in "ab"))

    history.cycle()

    assert len([p for p in history.events(PreemptionRequested) if p.job_id in lent]) == 1
