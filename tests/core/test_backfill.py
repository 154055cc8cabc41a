"""EASY backfill: the head gang gets a reservation on concrete nodes that smaller jobs respect."""

from __future__ import annotations

from schemas.jobs import JobDeferred, PreemptionRequested, ReservationPlanned
from tests.core.builders import History, a_job


def test_a_256_gpu_gang_is_not_starved_by_a_steady_stream_of_one_gpu_jobs() -> None:
    history = History("32x8:8:2")  # 256 GPUs
    history.submit(*(a_job().gpus(1).estimate(600) for _ in range(200)))
    history.run()
    big = history.submit(a_job().gpus(8).tasks(32).estimate(3600))[0]
    minutes_waited = 0
    while minutes_waited < 60 and history.job(big).state != "running":
        minutes_waited += 1
        # A new 1-GPU job every minute, each longer than the wait for the big gang.
        history.submit(a_job().gpus(1).estimate(7200))
        for view in list(history.state.jobs()):
            if (
                view.state == "running"
                and view.started_at is not None
                and history.now - view.started_at >= 600
                and view.job_id != big
            ):
                history.exit(view.job_id, 0)
        history.run(every_s=60)

    assert history.job(big).state == "running"
    assert minutes_waited <= 15  # the running 1-GPU jobs end after 10 minutes


def test_the_head_gang_gets_a_reservation_with_an_estimated_start_and_a_reason() -> None:
    history = History("4x8:4:1")
    started = history.now
    history.submit(*(a_job().gpus(8).estimate(1800) for _ in range(3)))
    history.run()
    head = history.submit(a_job().gpus(8).tasks(2).estimate(600))[0]

    history.run()

    planned = history.events(ReservationPlanned, head)
    assert len(planned) == 1
    view = history.job(head)
    assert view.estimated_start == started + 1800  # when the running gangs end, not later
    assert view.reason is not None and "earliest at 2023-11-14 22:43 UTC" in view.reason


def test_a_short_job_backfills_on_reserved_nodes_when_it_ends_before_the_reservation() -> None:
    history = History("2x8:2:1")
    blocker = history.submit(a_job().gpus(4).estimate(3600))[0]
    history.run()
    head = history.submit(a_job().gpus(8).tasks(2).estimate(600))[0]
    history.run()
    short = history.submit(a_job().gpus(4).estimate(600))[0]

    history.run()

    assert history.job(blocker).state == "running"
    assert history.job(head).state == "queued"
    assert history.job(short).state == "running"


def test_a_long_job_does_not_backfill_onto_nodes_reserved_for_the_head() -> None:
    history = History("2x8:2:1")
    history.submit(a_job().gpus(4).estimate(3600))
    history.run()
    head = history.submit(a_job().gpus(8).tasks(2).estimate(600))[0]
    history.run()
    long = history.submit(a_job().gpus(4).estimate(10 * 3600))[0]

    history.run()

    assert history.job(head).state == "queued"
    assert history.job(long).state == "queued"
    assert history.job(long).reason_code == "backfill_blocked"


def test_a_reservation_is_announced_once_not_every_cycle() -> None:
    history = History("4x8:4:1")
    history.submit(*(a_job().gpus(8).estimate(3600) for _ in range(4)))
    history.run()
    head = history.submit(a_job().gpus(8).tasks(2))[0]

    history.run(cycles=10, every_s=5)

    assert len(history.events(ReservationPlanned, head)) == 1


def test_a_backfilled_job_past_its_estimate_is_not_preempted_for_the_reservation() -> None:
    """An estimate is never a limit: the best-effort job that said 5 minutes and runs on is
    left alone; the research head's reservation is planned again, and it starts once the
    overrunning job ends on its own."""
    history = History("2x8:2:1")
    history.submit(a_job().gpus(8).estimate(600))
    history.run()
    head = history.submit(a_job().gpus(8).tasks(2).priority("research"))[0]
    history.run()
    liar = history.submit(a_job().gpus(8).estimate(300).priority("best-effort"))[0]
    history.run()
    assert history.job(liar).state == "running"

    for view in list(history.state.jobs()):
        if view.state == "running" and view.job_id != liar:
            history.advance(600)
            history.exit(view.job_id, 0)
    history.run(cycles=3, every_s=60)
    history.advance(history.policy.preemption_grace_s + 1)
    history.run(cycles=30, every_s=60)

    assert history.events(PreemptionRequested, liar) == []
    assert history.job(liar).state == "running"
    assert history.job(head).state == "queued"
    planned = history.events(ReservationPlanned, head)
    assert len(planned) >= 2  # re-planned as the overrun goes on, not given up
    assert planned[-1].start_at > planned[0].start_at

    history.exit(liar, 0)
    history.run(cycles=2)
    assert history.job(head).state == "running"


def test_a_job_that_stops_being_the_head_loses_its_estimated_start() -> None:
    history = History("2x8:2:1")
    history.submit(a_job().gpus(8).tasks(2).estimate(3600).priority("research"))
    history.run()
    first = history.submit(a_job().gpus(8).priority("research"))[0]
    history.run()
    assert history.job(first).estimated_start is not None

    history.submit(a_job().gpus(8).tasks(2).priority("production").preemptible(False))
    history.run()

    assert history.job(first).reason_code != "reserved_head"
    assert history.job(first).estimated_start is None


def test_a_new_head_does_not_explain_again_every_job_blocked_behind_the_reservation() -> None:
    """Thousands of jobs may wait behind a reservation: a change of head must not re-record
    each one's reason (the log would grow with the queue at every change)."""
    history = History("2x8:2:1")
    history.submit(a_job().gpus(4).estimate(3600).preemptible(False))
    history.run()
    first_head = history.submit(a_job().gpus(8).tasks(2).estimate(600))[0]
    history.run()
    idle_only = a_job().gpus(4).estimate(10 * 3600).priority("best-effort")
    long = history.submit(idle_only)[0]
    history.run()
    assert history.job(long).reason_code == "backfill_blocked"
    explained = len(history.events(JobDeferred, long))

    urgent = a_job().gpus(8).tasks(2).estimate(600).priority("production")
    second_head = history.submit(urgent)[0]
    history.run(cycles=2)

    assert history.job(second_head).reason_code == "reserved_head"
    assert history.job(first_head).reason_code != "reserved_head"
    assert history.job(long).reason_code == "backfill_blocked"
    assert len(history.events(JobDeferred, long)) == explained


def test_an_overdue_reservation_never_preempts_work_of_the_same_priority() -> None:
    history = History("2x8:2:1")
    history.submit(a_job().gpus(8).estimate(600))
    history.run()
    head = history.submit(a_job().gpus(8).tasks(2).priority("research"))[0]
    history.run()
    overrunning = history.submit(a_job().gpus(8).estimate(300).priority("research"))[0]
    history.run()
    assert history.job(overrunning).state == "running"

    for view in list(history.state.jobs()):
        if view.state == "running" and view.job_id != overrunning:
            history.advance(600)
            history.exit(view.job_id, 0)
    history.run(cycles=10, every_s=60)

    assert history.events(PreemptionRequested, overrunning) == []
    assert history.job(overrunning).state == "running"
    # The head waits with a reservation re-planned past the overrunning job's expected end.
    head_view = history.job(head)
    assert head_view.state == "queued" and head_view.estimated_start is not None
    assert head_view.estimated_start > history.now - 60
