"""One scenario per documented policy rule (DESIGN §3), each built so that it can pass only for
the reason in its name: the capacity for the other outcome is there, and the rule alone is what
keeps the scheduler from it. Every scenario also keeps the auditor's checks clean."""

from __future__ import annotations

from schemas.jobs import GangReserved, PreemptionRequested, ReservationPlanned
from schemas.nodes import NodeDrained
from tests.core.builders import History, a_job

HOUR = 3600.0


def _evict_all(history: History) -> None:
    for view in list(history.state.jobs()):
        if view.state == "preempting":
            history.evict(view.job_id)


# ---------------------------------------------------------------- preemption: who is a victim


def test_a_borrowing_gang_of_another_team_is_evicted_before_the_preemptors_own_team_gang() -> None:
    """The own team's best-effort gang is first in class order; only borrower-first saves it."""
    history = History("2x8:2:1")
    history.team("ops").team("lender")
    own = history.occupy("n0000", 8, a_job().team("ops").priority("best-effort"))
    borrowed = history.occupy("n0001", 8, a_job().team("lender").priority("research"))
    urgent = history.submit(a_job().gpus(8).team("ops").priority("production"))[0]

    history.run()

    assert [(p.job_id, p.preemptor_job_id) for p in history.events(PreemptionRequested)] == [
        (borrowed, urgent)
    ]
    assert history.job(own).state == "running"
    _evict_all(history)
    history.run()
    assert history.job(urgent).state == "running"
    assert history.auditor.violations == []


def test_another_team_never_preempts_a_gang_within_its_queues_guarantee() -> None:
    def scenario(guarantee: int) -> tuple[History, str, str]:
        history = History("1x8:1:1")
        history.team("owner", guaranteed=guarantee).team("ops")
        held = history.occupy("n0000", 8, a_job().team("owner").priority("research"))
        urgent = history.submit(a_job().gpus(8).team("ops").priority("inference-critical"))[0]
        history.run(cycles=3, every_s=60)
        return history, held, urgent

    protected, held, urgent = scenario(guarantee=8)
    assert protected.events(PreemptionRequested) == []
    assert protected.job(held).state == "running"
    assert protected.job(urgent).reason_code == "reserved_head"
    assert protected.auditor.violations == []

    # The same gang beyond its (empty) guarantee is borrowed capacity: it is taken.
    borrowing, held, urgent = scenario(guarantee=0)
    assert [p.job_id for p in borrowing.events(PreemptionRequested)] == [held]


def test_no_preemption_while_idle_gpus_could_serve_even_when_a_reservation_holds_them() -> None:
    """The job cannot start on the idle node only because the head's reservation pins it: it
    waits (backfill-blocked) rather than evict a best-effort gang it outranks."""
    history = History("2x8:2:1")
    history.occupy("n0000", 4, a_job().preemptible(False).estimate(HOUR))
    low = history.occupy("n0000", 4, a_job().priority("best-effort").estimate(24 * HOUR))
    head = history.submit(a_job().gpus(8).tasks(2).priority("inference-critical"))[0]
    history.run()
    assert history.job(head).reason_code == "reserved_head"
    late = history.submit(a_job().gpus(4).priority("production").estimate(30 * HOUR))[0]

    history.run(cycles=2)

    assert history.events(PreemptionRequested) == []
    assert history.job(low).state == "running"
    assert history.job(late).reason_code == "backfill_blocked"
    assert history.auditor.violations == []


def test_a_victim_is_credited_back_to_its_queue_within_the_cycle_so_one_eviction_suffices() -> None:
    """Two owner jobs reclaim in one cycle; after the first eviction the lender is back within
    its guarantee, so the second reclaim finds no borrowed capacity left to take."""
    history = History("2x8:2:1")
    history.team("lender", guaranteed=8).team("owner", guaranteed=8)
    lent = history.submit(*(a_job().gpus(8).team("lender") for _ in range(2)))
    history.run()
    history.submit(a_job().gpus(8).team("owner"), a_job().gpus(8).team("owner"))

    history.run()

    preemptions = history.events(PreemptionRequested)
    assert len(preemptions) == 1
    assert preemptions[0].job_id in lent
    assert history.auditor.violations == []


# ---------------------------------------------------------------- drains


def test_a_node_is_reported_drained_only_once_every_gang_on_it_has_left() -> None:
    history = History("2x8:2:1")
    history.occupy("n0001", 8)  # the evicted gangs have nowhere to go meanwhile
    first = history.occupy("n0000", 4, a_job().estimate(HOUR))
    second = history.occupy("n0000", 4, a_job().estimate(HOUR))
    history.drain("n0000")

    history.run()
    assert history.events(NodeDrained) == []
    assert {p.job_id for p in history.events(PreemptionRequested)} == {first, second}

    history.evict(first)
    history.run()
    assert history.job(first).state == "queued"
    assert history.events(NodeDrained) == []  # the second gang still holds GPUs there

    history.evict(second)
    history.run()
    assert [d.node_id for d in history.events(NodeDrained)] == ["n0000"]
    assert history.auditor.violations == []


# ---------------------------------------------------------------- order


def test_a_job_within_its_guarantee_goes_before_an_older_borrower() -> None:
    history = History("1x8:1:1")
    history.team("owner", guaranteed=8).team("borrower").team("infra")
    filler = history.occupy("n0000", 8, a_job().team("infra").preemptible(False))
    older = history.submit(a_job().gpus(8).team("borrower"))[0]
    history.run()
    within = history.submit(a_job().gpus(8).team("owner"))[0]
    history.run()
    history.exit(filler)

    history.run()

    assert history.job(within).state == "running"
    assert history.job(older).state == "queued"
    assert history.events(PreemptionRequested) == []  # placed first, not reclaimed after


def test_queue_weights_divide_fair_share_so_a_heavier_queue_goes_first() -> None:
    history = History("2x8:2:1")
    history.queue("light", guaranteed=8, weight=1.0).queue("heavy", guaranteed=8, weight=4.0)
    history.team("infra")
    past = history.submit(a_job().gpus(8).team("light"), a_job().gpus(8).team("heavy"))
    history.run()
    history.advance(HOUR)
    for job_id in past:  # equal usage: one node for one hour each
        history.exit(job_id)
    history.run()
    fillers = [
        history.occupy(node, 8, a_job().team("infra").preemptible(False))
        for node in ("n0000", "n0001")
    ]
    light = history.submit(a_job().gpus(8).team("light"))[0]  # older
    history.run()
    heavy = history.submit(a_job().gpus(8).team("heavy"))[0]
    history.run()
    history.exit(fillers[0])

    history.run()

    assert history.job(heavy).state == "running"
    assert history.job(light).state == "queued"


def test_aging_counts_from_the_last_requeue_not_from_submission() -> None:
    """A job submitted seven hours ago but requeued minutes ago is not aged: a higher class
    that waits goes first."""
    history = History("1x8:1:1")
    old = history.submit(a_job().gpus(8).priority("research"))[0]
    history.run()
    history.advance(7 * HOUR)
    preemptor = history.submit(a_job().gpus(8).priority("production").estimate(600))[0]
    history.run()
    history.evict(old)
    history.run()
    assert history.job(preemptor).state == "running"
    assert history.job(old).state == "queued"
    rival = history.submit(a_job().gpus(8).priority("production").preemptible(False))[0]
    history.run(cycles=2, every_s=60)
    history.exit(preemptor)

    history.run()

    assert history.job(rival).state == "running"
    assert history.job(old).state == "queued"


# ---------------------------------------------------------------- backfill and reservations


def test_the_heads_reservation_starts_when_the_first_gang_that_frees_room_ends() -> None:
    history = History("3x8:3:1")
    ends = {1800.0: "", 5400.0: "", 9000.0: ""}
    for seconds in ends:
        ends[seconds] = history.submit(a_job().gpus(8).estimate(seconds))[0]
    started = history.now
    history.run()
    head = history.submit(a_job().gpus(8).estimate(600))[0]

    history.run()

    planned = history.events(ReservationPlanned, head)
    assert len(planned) == 1
    assert planned[0].start_at.timestamp() == started + 1800
    assert planned[0].nodes == list(history.job(ends[1800.0]).placement)
    assert history.job(head).estimated_start == started + 1800


def test_backfill_never_delays_the_heads_reservation_even_by_a_little() -> None:
    history = History("2x8:2:1")
    started = history.now
    history.submit(a_job().gpus(4).estimate(HOUR).preemptible(False))
    history.run()
    head = history.submit(a_job().gpus(8).tasks(2).estimate(600))[0]
    history.run()
    start = history.job(head).estimated_start
    assert start == started + HOUR
    now = history.now
    late = history.submit(a_job().gpus(4).estimate(start - now + 300))[0]  # 5 min past start
    on_time = history.submit(a_job().gpus(4).estimate(start - now))[0]  # ends at the start

    history.run()

    assert history.job(late).reason_code == "backfill_blocked"
    assert history.job(on_time).state == "running"
    assert history.job(head).estimated_start == start
    assert history.auditor.violations == []


# ---------------------------------------------------------------- gangs


def test_a_rigid_gang_that_the_free_gpus_could_hold_only_in_part_waits_holding_nothing() -> None:
    """12 GPUs are free and the gang needs 12, but as 6 + 6: its 4-GPU tasks fit two, not three."""

    def scenario(min_tasks: int | None) -> tuple[History, str]:
        history = History("2x8:2:1")
        history.occupy("n0000", 2)
        history.occupy("n0001", 2)
        job = a_job().gpus(4).tasks(3)
        if min_tasks is not None:
            job.min_tasks(min_tasks)
        job_id = history.submit(job)[0]
        history.run()
        return history, job_id

    rigid_history, rigid = scenario(None)
    assert rigid_history.state.free_gpus == 12
    assert rigid_history.events(GangReserved, rigid) == []
    assert rigid_history.job(rigid).placement == {}
    assert rigid_history.auditor.violations == []

    elastic_history, elastic = scenario(2)  # the same shape may run on two tasks
    assert elastic_history.bound_gpus(elastic) == 8


def test_gangs_already_being_evicted_do_not_count_as_their_queues_borrowing() -> None:
    """Found by the property tests: each cycle counted the lender's gangs under eviction as
    still held, so one urgent job after another took its gangs until it had none left, below
    its guarantee. Gangs on their way out are credited: the last one is within the guarantee."""
    history = History("3x8:3:1")
    history.team("lender", guaranteed=8).team("ops")
    lent = history.submit(*(a_job().gpus(8).team("lender").priority("research") for _ in range(3)))
    history.run()
    for _ in range(3):
        history.submit(a_job().gpus(1).team("ops").priority("inference-critical"))
        history.run(agents=False)  # the evictions have not completed yet

    evicted = [p.job_id for p in history.events(PreemptionRequested)]
    assert len(evicted) == 2
    assert [j for j in lent if j not in evicted and history.job(j).state == "running"]
    assert history.auditor.violations == []
