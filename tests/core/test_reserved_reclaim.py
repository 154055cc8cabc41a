"""Idle GPUs reserved for the head serve a job behind it only if backfill lets it onto them
(core/reservation.py `kept_off_reserved`, one rule for backfill, the preemption planner and
the auditor's idle_capacity and borrowers_first rules): a job within its guarantee that backfill
keeps off them reclaims borrowed GPUs elsewhere; one that may backfill there evicts no one."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import pytest

from core import Auditor, Violation, parse_cluster_spec
from schemas.base import Event
from schemas.jobs import JobDeferred, PreemptionRequested, ReservationPlanned
from tests.core.builders import T0, History, a_job
from tests.core.test_audit_rules import job, preempt, rules, running, team
from tests.core.test_live_sharing import a_share, one_h100

T = 1_700_000_000.0


def _reserved_world(estimate: float) -> tuple[History, str, str, str]:
    """n0000: 4 GPUs of a non-preemptible gang ending in an hour, 4 idle (the head's, an
    8-GPU job of a queue within its guarantee); n0001: 4 GPUs a lender borrows, 4 of a
    non-preemptible gang. Then a 1-GPU job of queue q (within its guarantee), `estimate` long."""
    history = History("2x8:2:1")
    history.team("a", guaranteed=8).team("q", guaranteed=4).team("lender").team("infra")
    history.occupy("n0000", 4, a_job().team("infra").preemptible(False).estimate(3600))
    lent = history.occupy("n0001", 4, a_job().team("lender").estimate(86400))
    history.occupy("n0001", 4, a_job().team("infra").preemptible(False).estimate(86400))
    history.advance(10)
    head = history.submit(a_job().team("a").gpus(8))[0]
    history.advance(1)
    job_id = history.submit(a_job().team("q").gpus(1).estimate(estimate))[0]
    return history, head, lent, job_id


def _near_and_far(history: History) -> tuple[str, str]:
    """The head's node n0000: 4 GPUs of a non-preemptible gang ending in an hour and a
    lender's 1-GPU gang (`near`) ending in ten minutes; n0001: a lender's 4-GPU gang of a day
    (`far`) beside 4 non-preemptible GPUs. Ten seconds later: (near, far)."""
    history.occupy("n0000", 4, a_job().team("infra").preemptible(False).estimate(3600))
    near = history.occupy("n0000", 1, a_job().team("lender").estimate(600))
    far = history.occupy("n0001", 4, a_job().team("lender").estimate(86400))
    history.occupy("n0001", 4, a_job().team("infra").preemptible(False).estimate(86400))
    history.advance(10)
    return near, far


def test_a_job_that_may_backfill_onto_the_reserved_gpus_evicts_no_one() -> None:
    history, _, lent, job_id = _reserved_world(estimate=600)  # ends before the head starts

    history.run(cycles=3)

    assert history.events(PreemptionRequested) == []
    assert set(history.job(job_id).placement) == {"n0000"}
    assert history.job(lent).state == "running"
    assert history.auditor.violations == []


def test_a_reclaimer_kept_off_the_head_s_nodes_takes_borrowed_gpus_elsewhere_first() -> None:
    """A borrower on the head's node (a short job backfilled there) is the smallest victim,
    first in pool order; evicting it would land the reclaimer on the head's node, past the
    head's start. The reclaimer takes the borrower elsewhere: the head's start stays."""
    history = History("2x8:2:1")
    history.team("a", guaranteed=8).team("q", guaranteed=4).team("lender").team("infra")
    near, far = _near_and_far(history)
    head = history.submit(a_job().team("a").gpus(8))[0]
    history.advance(1)
    job_id = history.submit(a_job().team("q").gpus(1).estimate(7200))[0]

    history.run(cycles=3)

    assert [p.job_id for p in history.events(PreemptionRequested)] == [far]
    assert history.job(near).state == "running"
    for view in list(history.state.jobs()):
        if view.state == "preempting":
            history.evict(view.job_id)
    history.run(cycles=2)
    assert set(history.job(job_id).placement) == {"n0001"}
    assert history.events(ReservationPlanned, head)[-1].nodes == ["n0000"]
    assert history.auditor.violations == []


def test_the_reclaim_records_the_reservation_it_rested_on_in_its_cycle() -> None:
    """The core records a reservation only when it moves; a cycle that evicts for a job kept
    off it records it again (before the evictions), so the auditor reads the nodes and start
    the decision was planned with."""
    history = History("2x8:2:1")
    history.team("a", guaranteed=8).team("q", guaranteed=4).team("lender").team("infra")
    history.occupy("n0000", 4, a_job().team("infra").preemptible(False).estimate(3600))
    lent = history.occupy("n0001", 4, a_job().team("lender").estimate(86400))
    history.occupy("n0001", 4, a_job().team("infra").preemptible(False).estimate(86400))
    head = history.submit(a_job().team("a").gpus(8))[0]
    history.run(cycles=2)  # the head's reservation is recorded once
    assert len(history.events(ReservationPlanned, head)) == 1
    job_id = history.submit(a_job().team("q").gpus(1).estimate(7200))[0]

    decisions = history.cycle()

    kinds = [type(e).__name__ for e in decisions if getattr(e, "job_id", "") in (head, lent)]
    assert kinds[:2] == ["ReservationPlanned", "PreemptionRequested"], kinds
    assert len(history.events(ReservationPlanned, head)) == 2
    assert [p.preemptor_job_id for p in history.events(PreemptionRequested)] == [job_id]
    assert history.auditor.violations == []


def test_a_reservation_that_drifts_every_cycle_makes_no_reclaim_storm() -> None:
    """The gang on the head's node runs past its estimate: the head's start is planned a
    grace after each cycle's clock (recorded whenever it moves past the threshold). The job
    kept off it reclaims once, lands on what it reclaimed, and nobody is evicted again."""
    history, head, lent, job_id = _reserved_world(estimate=7200)
    for _ in range(3):
        history.run(cycles=1)
        history.advance(1)
    for view in list(history.state.jobs()):
        if view.state == "preempting":
            history.evict(view.job_id)
    for _ in range(60):  # two hours, past the gang's estimate and past the hysteresis
        history.run(cycles=1)
        history.advance(120)

    evictions = history.events(PreemptionRequested)
    assert [(p.job_id, p.preemptor_job_id) for p in evictions] == [(lent, job_id)]
    assert set(history.job(job_id).placement) == {"n0001"}
    assert history.job(head).placement == {}  # its node's gang runs on
    assert len(history.events(ReservationPlanned, head)) > 2  # it did drift
    assert history.auditor.violations == []


def test_a_job_preempting_by_class_alone_still_waits_for_the_head_s_idle_gpus() -> None:
    """The rule is the reclaim's (invariant 4): a job of a queue without a guarantee, kept off
    the reserved GPUs, preempts no lower class for them; it waits for the head's start, as
    before (bench_core, with classes and no guarantees, decides byte for byte as before)."""
    history = History("2x8:2:1")
    history.occupy("n0000", 4, a_job().team("infra").preemptible(False).estimate(3600))
    low = history.occupy("n0001", 4, a_job().team("low").priority("research").estimate(86400))
    history.occupy("n0001", 4, a_job().team("infra").preemptible(False).estimate(86400))
    history.advance(10)
    history.submit(a_job().team("a").priority("production").gpus(8))
    history.advance(1)
    job_id = history.submit(a_job().team("q").priority("production").gpus(1).estimate(7200))[0]

    history.run(cycles=3)

    assert history.events(PreemptionRequested) == []
    assert history.job(low).state == "running"
    assert history.deferrals(job_id)[-1].code == "backfill_blocked"
    assert history.auditor.violations == []


def test_a_head_that_reclaims_itself_keeps_no_reclaimer_off_its_reserved_nodes() -> None:
    """review14: the head (within its guarantee) reclaims a borrower's whole node in the cycle
    that reserved n0000's idle GPUs for it: it lands on its victims' GPUs, not there. A job
    behind it was still kept off n0000 and evicted another borrower's gang for a GPU, while
    n0000's idle GPUs served it (it is placed there the next cycle when nobody is evicted)."""
    history = History("3x8:3:1")
    history.team("a", guaranteed=8).team("q", guaranteed=4).team("lender").team("infra")
    history.occupy("n0000", 4, a_job().team("infra").preemptible(False).estimate(3600))
    whole = history.occupy("n0001", 8, a_job().team("lender").estimate(86400))
    other = history.occupy("n0002", 4, a_job().team("lender").estimate(86400))
    history.occupy("n0002", 4, a_job().team("infra").preemptible(False).estimate(86400))
    history.advance(10)
    head = history.submit(a_job().team("a").gpus(8))[0]
    history.advance(1)
    job_id = history.submit(a_job().team("q").gpus(1).estimate(7200))[0]

    history.run(cycles=2)

    evictions = [(p.job_id, p.preemptor_job_id) for p in history.events(PreemptionRequested)]
    assert evictions == [(whole, head)]
    assert history.job(other).state == "running"
    assert set(history.job(job_id).placement) == {"n0000"}
    assert history.auditor.violations == []


def test_no_landing_is_held_for_a_reclaim_the_head_s_own_reclaim_makes_needless() -> None:
    """review14: placing foresees the reclaims of the preemption phase (`ReclaimLandings`) and
    holds the free GPUs they land on from the jobs behind. Foreseen with q's job kept off
    n0000 although the head reclaims n0001 itself, it held n0002's free GPU for a reclaim the
    preemption phase refuses (n0000's idle GPUs serve q's job), and the job behind waited a
    cycle for nothing."""
    history = History("3x8:3:1")
    for name, guaranteed in (("a", 8), ("q", 4), ("lender", 0), ("infra", 0), ("r", 0)):
        history.team(name, guaranteed=guaranteed)
    history.occupy("n0000", 4, a_job().team("infra").preemptible(False).estimate(3600))
    whole = history.occupy("n0001", 8, a_job().team("lender").estimate(86400))
    history.occupy("n0002", 1, a_job().team("infra").preemptible(False).estimate(86400))
    gone = history.occupy("n0002", 1, a_job().team("infra").preemptible(False).estimate(86400))
    history.occupy("n0002", 4, a_job().team("lender").estimate(86400))
    history.occupy("n0002", 2, a_job().team("infra").preemptible(False).estimate(86400))
    history.exit(gone)  # n0002's GPU 1 is free, below the lender's four
    history.advance(10)
    head = history.submit(a_job().team("a").gpus(8))[0]
    history.advance(1)
    job_id = history.submit(a_job().team("q").gpus(2).estimate(7200))[0]
    history.advance(1)
    behind = history.submit(a_job().team("r").gpus(1).estimate(7200))[0]

    history.run(cycles=1)

    evictions = [(p.job_id, p.preemptor_job_id) for p in history.events(PreemptionRequested)]
    assert evictions == [(whole, head)]
    assert history.job(behind).placement == {"n0002": [1]}
    history.run(cycles=1)
    assert set(history.job(job_id).placement) == {"n0000"}
    assert history.auditor.violations == []


def test_a_reclaimer_kept_off_the_head_s_nodes_reclaims_borrowed_shares_elsewhere() -> None:
    """review14: the one rule holds for slices and shares too (core/sharing_reclaim.py). The
    borrowed capacity is two MPS shares of a lender on n0001's last GPU; the job of q, kept
    off n0000, read the head's idle GPUs there as serving it in the shared-GPU reclaim and
    waited as long as the head (invariant 4). It reclaims the shares, the cycle records the
    reservation before the evictions, and it lands on the GPU they held."""
    history = History(cluster=one_h100(mig="none", gpus=8, count=2))
    history.team("a", guaranteed=8).team("q", guaranteed=4).team("lender").team("infra")
    full = history.occupy("n0000", 8, a_job().team("infra").preemptible(False))
    history.occupy("n0001", 7, a_job().team("infra").preemptible(False))
    shares = history.submit(
        *(a_share(0.5, team="lender").priority("research").estimate(86400) for _ in range(2))
    )
    history.run(cycles=2)
    assert all(history.job(share).placement == {"n0001": [7]} for share in shares)
    history.exit(full)
    history.run(cycles=1)
    history.occupy("n0000", 4, a_job().team("infra").preemptible(False).estimate(3600))
    history.advance(10)
    head = history.submit(a_job().team("a").gpus(8))[0]
    history.run(cycles=2)  # the head's reservation (n0000) is recorded once
    assert len(history.events(ReservationPlanned, head)) == 1
    job_id = history.submit(a_job().team("q").gpus(1).estimate(7200))[0]

    decisions = history.cycle()

    kinds = [type(e).__name__ for e in decisions if getattr(e, "job_id", "") in (head, *shares)]
    assert kinds[:2] == ["ReservationPlanned", "PreemptionRequested"], kinds
    evicted = {p.job_id for p in history.events(PreemptionRequested)}
    assert evicted == set(shares)
    for share in shares:
        history.evict(share)
    history.run(cycles=2)
    assert history.job(job_id).placement == {"n0001": [7]}
    assert history.auditor.violations == []


def test_a_head_that_reclaims_shares_itself_keeps_no_reclaimer_off_its_reserved_nodes() -> None:
    """review14: as when the head evicts gangs, a head that reclaims borrowed shares (on
    n0001) lands on the GPUs they free, not on n0000: a job behind it evicted the lender's
    gang on n0002 for a GPU while n0000's idle GPUs served it (the auditor's idle_capacity)."""
    history = History(cluster=one_h100(mig="none", gpus=8, count=3))
    history.team("a", guaranteed=8).team("q", guaranteed=4).team("lender").team("infra")
    full = [
        history.occupy("n0000", 8, a_job().team("infra").preemptible(False)),
        history.occupy("n0002", 8, a_job().team("infra").preemptible(False)),
    ]
    history.occupy("n0001", 4, a_job().team("infra").preemptible(False))
    shares = history.submit(
        *(a_share(0.5, team="lender").priority("research").estimate(86400) for _ in range(8))
    )
    history.run(cycles=2)
    assert all(set(history.job(share).placement) == {"n0001"} for share in shares)
    for job_id in full:
        history.exit(job_id)
    history.run(cycles=1)
    history.occupy("n0000", 5, a_job().team("infra").preemptible(False).estimate(3600))
    lent = history.occupy("n0002", 4, a_job().team("lender").estimate(86400))
    history.occupy("n0002", 4, a_job().team("infra").preemptible(False).estimate(86400))
    history.advance(10)
    head = history.submit(a_job().team("a").gpus(4))[0]
    history.advance(1)
    job_id = history.submit(a_job().team("q").gpus(1).estimate(7200))[0]

    history.run(cycles=1)

    evictions = {(p.job_id, p.preemptor_job_id) for p in history.events(PreemptionRequested)}
    assert evictions == {(share, head) for share in shares}
    for share in shares:
        history.evict(share)
    history.run(cycles=1)
    assert set(history.job(head).placement) == {"n0001"}
    assert set(history.job(job_id).placement) == {"n0000"}
    assert history.job(lent).state == "running"
    assert history.auditor.violations == []


def test_a_head_that_reclaims_says_so_beside_a_reclaimer_behind_it() -> None:
    """review14 (the Philly week's first difference, head 72748 at 2017-10-17 11:59:44): the
    head's reservation, recorded a cycle before, is recorded again for a job behind it whose
    reclaim was planned as kept off it, after the head had asked for evictions itself; that
    record gave the head its "reserved_head" reason back, an earliest start on nodes it will
    not use, while it waited for its victims."""
    history = History("3x8:3:1")
    history.team("a", guaranteed=8).team("q", guaranteed=8).team("lender").team("infra")
    history.occupy("n0000", 4, a_job().team("infra").preemptible(False).estimate(3600))
    whole = history.occupy("n0001", 8, a_job().team("lender").min_runtime(600))
    history.occupy("n0002", 6, a_job().team("lender").estimate(86400))
    history.occupy("n0002", 2, a_job().team("infra").preemptible(False).estimate(86400))
    history.advance(10)
    head = history.submit(a_job().team("a").gpus(8))[0]
    history.run(cycles=1)  # reserved on n0000; the gang on n0001 is within its min runtime
    assert history.events(PreemptionRequested) == []
    history.advance(700)
    job_id = history.submit(a_job().team("q").gpus(6).estimate(7200))[0]

    history.run(cycles=1)

    preemptors = {p.preemptor_job_id for p in history.events(PreemptionRequested)}
    assert preemptors == {head, job_id}
    assert [
        p.job_id for p in history.events(PreemptionRequested) if p.preemptor_job_id == head
    ] == [whole]
    assert history.deferrals(head)[-1].code == "preempting"
    assert history.auditor.violations == []


@pytest.mark.xfail(
    strict=True,
    reason="review14, open: with no room and no borrower off the head's nodes, a reclaimer kept "
    "off them evicts a borrower on them (the second pass of `_off_reserved_first`) and lands "
    "there anyway, delaying the head as much as the idle GPU there would have; the borrower is "
    "requeued and backfilled back onto the same GPUs. Not evicting needs the place phase to let "
    "such a reclaimer onto the reserved idle GPUs, and the auditor's backfill rule to accept "
    "it: a decision of DESIGN §3 (invariant 4 over the reservation) first",
)
def test_a_reclaimer_that_lands_on_the_head_s_nodes_anyway_takes_the_idle_gpu_there() -> None:
    """n0000: 3 GPUs of a gang ending in an hour, 4 of a borrower ending then too, 1 idle: the
    head (8 GPUs) is reserved there. n0001 is full for a day. q's 2-hour job, within its
    guarantee, has nothing to reclaim elsewhere: it evicted the borrower on n0000, landed on
    one of its GPUs (the head's start moved an hour later), and the borrower, requeued, was
    backfilled onto the same four GPUs at once (it ends before the head's new start)."""
    history = History("2x8:2:1")
    history.team("a", guaranteed=8).team("q", guaranteed=4).team("lender").team("infra")
    history.occupy("n0000", 3, a_job().team("infra").preemptible(False).estimate(3600))
    lent = history.occupy("n0000", 4, a_job().team("lender").estimate(3600))
    history.occupy("n0001", 8, a_job().team("infra").preemptible(False).estimate(86400))
    history.advance(10)
    history.submit(a_job().team("a").gpus(8))
    history.advance(1)
    job_id = history.submit(a_job().team("q").gpus(1).estimate(7200))[0]

    for _ in range(4):
        for view in list(history.state.jobs()):
            if view.state == "preempting":
                history.evict(view.job_id)
        history.run(cycles=1, every_s=30)

    assert history.events(PreemptionRequested) == []
    assert history.job(job_id).placement == {"n0000": [7]}
    assert history.job(lent).state == "running"
    assert history.auditor.violations == []


# ---------------------------------------------------------------- the auditor, by hand


def _log(
    estimate: float,
    *,
    extra_node: bool = False,
    recorded_before: bool = False,
    guaranteed: int = 4,
    priority: str = "research",
    head_reclaims: bool = False,
) -> list[Event]:
    """The world of `_reserved_world` as a log: h the head (n0000 reserved, starting in an
    hour), j the 1-GPU job of q, then one cycle: the reservation recorded, j evicts the
    lender's gang (`recorded_before`: the reservation recorded a cycle earlier instead;
    `head_reclaims`: first h evicts a lender's gang holding all of n0002, in the same cycle)."""
    cycle = T + 1000
    reservation = ReservationPlanned(
        job_id="h",
        start_at=datetime.fromtimestamp(cycle + 3600, UTC),
        nodes=["n0000"],
        decided_at=datetime.fromtimestamp(cycle, UTC),
    )
    events: list[Event] = [
        *parse_cluster_spec("3x8:3:1" if extra_node or head_reclaims else "2x8:2:1"),
        team("a", 8),
        team("q", guaranteed),
        team("lender"),
        team("infra"),
        *job("i0", team="infra", gpus_per_task=4, preemptible=False),
        *running("i0", ("n0000", [0, 1, 2, 3])),
        *job("lent", team="lender", gpus_per_task=4),
        *running("lent", ("n0001", [0, 1, 2, 3])),
        *job("i1", team="infra", gpus_per_task=4, preemptible=False),
        *running("i1", ("n0001", [4, 5, 6, 7])),
    ]
    if extra_node:
        events += [
            *job("i2", team="infra", gpus_per_task=7, preemptible=False),
            *running("i2", ("n0002", [0, 1, 2, 3, 4, 5, 6])),
        ]
    if head_reclaims:
        events += [*job("whole", team="lender"), *running("whole", ("n0002", list(range(8))))]
    events += [
        *job("h", team="a"),
        *job("j", team="q", priority=priority, gpus_per_task=1, estimated_runtime_s=estimate),
    ]
    if recorded_before:
        events += [reservation, JobDeferred(job_id="j", code="backfill_blocked", message="m")]
        return [*events, preempt("lent", "j")]
    if head_reclaims:
        return [*events, reservation, preempt("whole", "h"), preempt("lent", "j")]
    return [*events, reservation, preempt("lent", "j")]


def _audit(events: list[Event], in_cycle: int = 2) -> list[Violation]:
    """Each event a second after the last, the last `in_cycle` (and a reservation) in one cycle."""
    auditor = Auditor()
    cycle = T + 1000
    first = len(events) - in_cycle
    for position, event in enumerate(events):
        at = cycle if position >= first else T + position
        if isinstance(event, ReservationPlanned):
            at = cycle
        auditor.observe(event, position, at, None)
    return auditor.violations


def test_the_auditor_accepts_a_reclaim_by_a_job_kept_off_the_reserved_gpus() -> None:
    assert _audit(_log(estimate=7200)) == []


def test_the_auditor_flags_a_reclaim_by_a_job_that_may_backfill_onto_them() -> None:
    violations = _audit(_log(estimate=600))
    assert rules(violations) == {"idle_capacity"}
    assert "idle GPUs could host job j" in violations[0].message


def test_the_auditor_flags_a_reclaim_while_unreserved_idle_gpus_could_serve() -> None:
    # n0002 has one idle GPU, reserved for no one: it serves j.
    violations = _audit(_log(estimate=7200, extra_node=True))
    assert rules(violations) == {"idle_capacity"}


def test_the_auditor_reads_only_a_reservation_recorded_in_the_deciding_cycle() -> None:
    # Recorded a cycle before (a JobDeferred between): the log does not say the head's
    # nodes were still n0000 when j evicted, so the idle GPUs there count as serving it.
    violations = _audit(_log(estimate=7200, recorded_before=True))
    assert rules(violations) == {"idle_capacity"}


def test_the_auditor_counts_the_reserved_gpus_for_a_preemption_by_class() -> None:
    # q has no guarantee: j preempts the lender's research gang by its class (production),
    # and the idle GPUs of the head's node count as serving it, as the core counts them.
    violations = _audit(_log(estimate=7200, guaranteed=0, priority="production"))
    assert rules(violations) == {"idle_capacity"}


def test_the_auditor_counts_the_reserved_gpus_once_the_head_reclaims_itself() -> None:
    # review14: h evicts the gang on n0002 in the same cycle: it lands there, and the idle GPUs
    # of n0000, reserved for it, serve j (the core keeps no one off them then).
    violations = _audit(_log(estimate=7200, head_reclaims=True), in_cycle=3)
    assert rules(violations) == {"idle_capacity"}
    assert "idle GPUs could host job j" in violations[0].message


def test_two_reclaims_kept_off_in_one_cycle_record_the_reservation_once() -> None:
    """The reservation is recorded in the cycle the first kept-off reclaim rests on it; the
    second reclaim of that cycle rests on the same record (one event, not one per reclaim)."""
    history = History("2x8:2:1")
    history.team("a", guaranteed=8).team("q", guaranteed=4).team("lender").team("infra")
    history.occupy("n0000", 4, a_job().team("infra").preemptible(False).estimate(3600))
    lent = [history.occupy("n0001", 2, a_job().team("lender").estimate(86400)) for _ in "ab"]
    history.occupy("n0001", 4, a_job().team("infra").preemptible(False).estimate(86400))
    head = history.submit(a_job().team("a").gpus(8))[0]
    history.run(cycles=2)
    assert len(history.events(ReservationPlanned, head)) == 1
    reclaimers = history.submit(*[a_job().team("q").gpus(2).estimate(7200) for _ in "ab"])

    decisions = history.cycle()

    assert [e.job_id for e in decisions if isinstance(e, ReservationPlanned)] == [head]
    evictions = {(p.job_id, p.preemptor_job_id) for p in history.events(PreemptionRequested)}
    assert evictions == set(zip(lent, reclaimers, strict=True)) or evictions == set(
        zip(lent, reversed(reclaimers), strict=True)
    )
    assert history.auditor.violations == []


def test_a_preemption_by_class_does_not_record_the_reservation_again() -> None:
    """Only a reclaim kept off the reserved nodes rests on the head's reservation: one by
    class alone (the head's nodes have no idle GPU) records nothing more of it."""
    history = History("2x8:2:1")
    history.occupy("n0000", 8, a_job().team("infra").preemptible(False).estimate(3600))
    history.occupy("n0001", 7, a_job().team("infra").preemptible(False).estimate(86400))
    low = history.occupy("n0001", 1, a_job().team("low").priority("research").estimate(86400))
    history.advance(10)
    head = history.submit(a_job().team("a").priority("production").gpus(8))[0]
    history.run(cycles=2)
    assert len(history.events(ReservationPlanned, head)) == 1
    job_id = history.submit(a_job().team("a").priority("production").gpus(1).estimate(60))[0]

    decisions = history.cycle()

    assert [(p.job_id, p.preemptor_job_id) for p in history.events(PreemptionRequested)] == [
        (low, job_id)
    ]
    assert not any(isinstance(e, ReservationPlanned) for e in decisions)
    assert len(history.events(ReservationPlanned, head)) == 1


def test_a_reclaimer_that_ends_before_the_head_starts_counts_the_head_s_idle_gpus() -> None:
    """The backfill rule keeps off the head's nodes only a job that would not end before the
    head's planned start: one that ends before it may land beside the idle GPUs there, so its
    reclaim takes the small borrower on the head's node, not a whole gang elsewhere."""
    history = History("2x8:2:1")
    history.team("a", guaranteed=8).team("q", guaranteed=4).team("lender").team("infra")
    near, far = _near_and_far(history)
    # (Of a higher class than the job behind it: first in line, whatever the teams' shares.)
    head = history.submit(a_job().team("a").priority("production").gpus(8))[0]
    history.advance(1)
    job_id = history.submit(a_job().team("q").priority("research").gpus(4).estimate(600))[0]

    history.run(cycles=2)

    evictions = [(p.job_id, p.preemptor_job_id) for p in history.events(PreemptionRequested)]
    assert evictions == [(near, job_id)]
    history.evict(near)
    history.run(cycles=1)
    assert set(history.job(job_id).placement) == {"n0000"}
    assert history.job(far).state == "running"
    assert history.events(ReservationPlanned, head)[-1].nodes == ["n0000"]
    assert history.auditor.violations == []


def test_the_head_s_reason_and_its_reservation_are_worded_in_utc_whatever_the_host_zone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A scheduler host set to another zone (half an hour off, so the minutes differ too)
    words the head's earliest start and stamps the reservation's decision in UTC."""
    monkeypatch.setenv("TZ", "Asia/Kolkata")
    time.tzset()
    try:
        history = History("2x8:2:1")
        history.occupy("n0000", 4, a_job().team("infra").preemptible(False).estimate(3600))
        history.occupy("n0001", 8, a_job().team("infra").preemptible(False).estimate(86400))
        head = history.submit(a_job().team("a").gpus(8))[0]

        history.run(cycles=1)

        planned = history.events(ReservationPlanned, head)[-1]
        assert planned.decided_at == datetime.fromtimestamp(T0, UTC)
        assert planned.decided_at is not None and planned.decided_at.utcoffset() is not None
        moment = planned.start_at.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")
        assert f"earliest at {moment} on rack" in history.deferrals(head)[-1].message
    finally:
        monkeypatch.undo()
        time.tzset()


def test_whether_a_reclaimer_is_kept_off_follows_its_learned_runtime() -> None:
    """A `probe` of queue q gave no estimate (the policy's default would be four hours, past
    the head's start in an hour) but probes ran ten minutes: it would end before the head's
    start, so the head's idle GPUs serve it and its reclaim takes the borrower beside them."""
    history = History("2x8:2:1")
    history.team("a", guaranteed=8).team("q", guaranteed=4).team("lender").team("infra")
    for _ in range(3):
        probe = history.submit(a_job().named("probe").team("q").gpus(1))[0]
        history.run()
        history.advance(600)
        history.exit(probe)
        history.run()
    near, far = _near_and_far(history)
    history.submit(a_job().team("a").priority("production").gpus(8))
    history.advance(1)
    job_id = history.submit(a_job().named("probe").team("q").priority("research").gpus(4))[0]

    history.run(cycles=2)

    evictions = [(p.job_id, p.preemptor_job_id) for p in history.events(PreemptionRequested)]
    assert evictions == [(near, job_id)]
    assert history.job(far).state == "running"
    assert history.auditor.violations == []
