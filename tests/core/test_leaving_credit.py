"""A gang on its way out leaves its queue's usage once per cycle (core/preemption.py,
credit_leaving): counted in full, its team looked like a borrower; credited once per phase
(the priority planner, then fairness, then each fairness preemptor), its team looked further
within its guarantee than it is, and fairness made it borrow.

Its preemptor is on its way in (book_arriving): the GPUs it asked for count to its queue from
the moment it asks for evictions until it lands. Uncounted, a queue owed 4 GPUs reclaimed 4 for
every job of it that waited, in one cycle and in each cycle while the first victims
checkpointed, and a job behind the preemptor took the quota room it evicted for."""

from __future__ import annotations

from collections.abc import Set as AbstractSet

from core.context import CycleContext
from core.preemption import book_arriving, credit_leaving
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


def owed_four() -> tuple[History, list[str], list[str]]:
    """Queue q is guaranteed 4 GPUs and uses none; a lender borrows the whole node in two
    4-GPU gangs. Two 4-GPU jobs of q wait: q is owed 4 GPUs, one lender gang's worth."""
    history = History("1x8:1:1").team("q", guaranteed=4).team("lender")
    lent = [history.occupy("n0000", 4, a_job().team("lender").estimate(86400)) for _ in "ab"]
    history.advance(600)
    waiting = history.submit(*(a_job().gpus(4).team("q").estimate(3600) for _ in "ab"))
    return history, lent, waiting


def evicted(history: History, lent: list[str]) -> list[str]:
    return [p.job_id for p in history.events(PreemptionRequested) if p.job_id in lent]


def test_a_queue_reclaims_no_more_than_its_guarantee_in_one_cycle() -> None:
    history, lent, _ = owed_four()

    history.cycle()

    assert len(evicted(history, lent)) == 1
    assert history.auditor.violations == []


def test_a_queue_reclaims_no_more_while_its_first_victim_checkpoints() -> None:
    history, lent, (first, second) = owed_four()
    history.cycle()
    for _ in range(3):  # the victim has not stopped yet: its GPUs are still held
        history.advance(30)
        history.cycle()

    assert len(evicted(history, lent)) == 1
    assert history.job(first).state in ("pending", "queued")
    assert history.job(second).reason_code != "preempting"
    assert history.auditor.violations == []


def test_a_preemptor_counts_to_its_queue_until_it_lands_and_then_once() -> None:
    history, lent, (first, _) = owed_four()
    history.cycle()
    # Next cycle's book: the victim's 4 GPUs off the lender's usage, the preemptor's onto q's.
    ctx = CycleContext.start(history.state, history.now)
    quota = QuotaBook(history.state.queue_records)
    book_arriving(ctx, quota)
    credit_leaving(ctx, quota)
    assert (quota.usage.get("q", 0), quota.usage.get("lender", 0)) == (4, 4)

    (victim,) = evicted(history, lent)
    history.evict(victim)
    history.run(cycles=2)  # the preemptor lands on its victim's GPUs

    assert history.job(first).state == "running"
    ctx = CycleContext.start(history.state, history.now)
    quota = QuotaBook(history.state.queue_records)
    book_arriving(ctx, quota)
    credit_leaving(ctx, quota)
    assert (quota.usage.get("q", 0), quota.usage.get("lender", 0)) == (4, 4)
    assert history.auditor.violations == []


def test_a_job_whose_queue_a_reclaim_already_fills_preempts_by_its_class_alone() -> None:
    # ops is guaranteed 16 GPUs and holds 8 (a best-effort gang); the lender borrows two nodes.
    # ops' research job reclaims the lender's research gang: ops will hold all 16. Its
    # production job then takes no more borrowed GPUs (a reclaim beyond the guarantee) but
    # evicts, by its class, ops' own best-effort gang; the lender's production gang is of its
    # own class. The auditor reads ops as the core does, the arriving reclaim counted: no
    # borrowers_first report for leaving the lender's gang alone.
    history = History("3x8:3:1").team("ops", guaranteed=16).team("lender")
    mine = history.occupy("n0002", 8, a_job().team("ops").priority("best-effort"))
    lent_research = history.occupy("n0000", 8, a_job().team("lender").priority("research"))
    lent_production = history.occupy("n0001", 8, a_job().team("lender").priority("production"))
    history.advance(600)
    reclaimer = history.submit(a_job().team("ops").priority("research").gpus(8))[0]
    history.cycle()
    history.advance(30)
    urgent = history.submit(a_job().team("ops").priority("production").gpus(8))[0]
    history.cycle()

    evictions = {(p.job_id, p.preemptor_job_id) for p in history.events(PreemptionRequested)}
    assert evictions == {(lent_research, reclaimer), (mine, urgent)}
    assert history.job(lent_production).state == "running"
    assert history.auditor.violations == []


def test_a_job_behind_a_reclaim_does_not_take_the_quota_room_it_evicted_for() -> None:
    # q may use 8 GPUs, its guarantee. Its 8-GPU job reclaims the lender's node; while the
    # victim checkpoints, 4 GPUs come free elsewhere and a 4-GPU job of q arrives. Placed
    # there, it left the preemptor at q's ceiling once the victim had gone: the lender's gang
    # evicted for nothing, its node idle. It waits for the ceiling instead.
    history = History("2x8:2:1")
    history.team("q", guaranteed=8, max_gpus=8).team("lender").team("infra", guaranteed=8)
    lent = history.occupy("n0000", 8, a_job().team("lender").estimate(86400))
    ending = history.occupy("n0001", 4, a_job().team("infra").preemptible(False).estimate(600))
    history.occupy("n0001", 4, a_job().team("infra").preemptible(False).estimate(86400))
    history.advance(600)
    first = history.submit(a_job().gpus(8).team("q").estimate(3600))[0]
    history.run()
    assert evicted(history, [lent]) == [lent]
    history.exit(ending, 0)
    second = history.submit(a_job().gpus(4).team("q").estimate(3600))[0]

    history.run()

    assert history.job(second).reason_code == "quota_ceiling"
    history.evict(lent)
    history.run(cycles=2)
    assert history.job(first).state == "running"
    assert history.job(first).placement == {"n0000": list(range(8))}
    assert history.job(second).reason_code == "quota_ceiling"
    assert history.auditor.violations == []


def arriving_book(history: History, released: AbstractSet[str] = frozenset()) -> QuotaBook:
    """A cycle's quota book with the preemptors on their way in booked."""
    ctx = CycleContext.start(history.state, history.now)
    ctx.released |= released
    quota = QuotaBook(history.state.queue_records)
    book_arriving(ctx, quota)
    return quota


def test_a_preemptor_of_two_victims_arrives_once_and_only_while_it_waits() -> None:
    history = History("1x8:1:1").team("q", guaranteed=8).team("lender")
    lent = [history.occupy("n0000", 4, a_job().team("lender").estimate(86400)) for _ in "ab"]
    history.advance(600)
    (waiting,) = history.submit(a_job().gpus(8).team("q").estimate(3600))
    history.cycle()
    assert sorted(evicted(history, lent)) == sorted(lent)

    assert arriving_book(history).usage.get("q", 0) == 8  # not once per victim
    # A victim gone this very cycle: the preemptor lands now, charged as it binds.
    assert arriving_book(history, released=set(lent)).usage.get("q", 0) == 0
    history.cancel(waiting)
    history.cycle()  # cancelled: it waits no more
    assert history.job(waiting).state == "cancelled"
    assert arriving_book(history).usage.get("q", 0) == 0


def test_a_gang_leaving_for_no_one_does_not_hide_a_preemptor_behind_it() -> None:
    history = History("2x8:2:1").team("q", guaranteed=4).team("lender")
    suspended = history.occupy("n0001", 8, a_job().team("lender"))
    lent = history.occupy("n0000", 4, a_job().team("lender").estimate(86400))
    history.occupy("n0000", 4, a_job().team("lender").preemptible(False).estimate(86400))
    history.advance(600)
    history.suspend(suspended)  # under eviction first, for no preemptor
    history.submit(a_job().gpus(4).team("q").estimate(3600))
    history.cycle()
    assert evicted(history, [lent]) == [lent]

    assert arriving_book(history).usage.get("q", 0) == 4


def test_two_queues_reclaim_a_lender_down_to_its_guarantee_not_below() -> None:
    # The lender is guaranteed 4 and holds 8: 4 borrowed. q1 and q2, each owed 4, wait:
    # one of them reclaims the borrowed 4; the other may not take the lender's guarantee.
    history = History("2x8:2:1").team("q1", guaranteed=4).team("q2", guaranteed=4)
    history.team("lender", guaranteed=4).team("infra", guaranteed=4)
    history.occupy("n0001", 8, a_job().team("infra").preemptible(False).estimate(86400))
    lent = [history.occupy("n0000", 4, a_job().team("lender").estimate(86400)) for _ in "ab"]
    history.advance(600)
    history.submit(a_job().gpus(4).team("q1").estimate(3600))
    history.submit(a_job().gpus(4).team("q2").estimate(3600))

    history.cycle()

    assert len(evicted(history, lent)) == 1
    assert history.auditor.violations == []
