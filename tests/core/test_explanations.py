"""Every waiting job carries a reason a person understands, recorded only when it changes."""

from __future__ import annotations

from schemas.jobs import JobDeferred
from tests.core.builders import History, a_job


def test_a_job_that_can_never_fit_says_why() -> None:
    history = History("2x8:2:1")
    job = history.submit(a_job().gpus(16))[0]

    history.run()

    view = history.job(job)
    assert view.reason_code == "unsatisfiable"
    assert view.reason is not None and "largest has 8" in view.reason


def test_a_job_of_a_missing_gpu_type_says_so() -> None:
    history = History("2x8:2:1")
    job = history.submit(a_job().gpus(1).gpu_type("B200"))[0]

    history.run()

    assert "no schedulable B200" in (history.job(job).reason or "")


def test_a_deferral_is_recorded_once_while_the_reason_stays_the_same() -> None:
    history = History("1x8:1:1")
    history.submit(a_job().gpus(8))
    history.run()
    waiting = history.submit(a_job().gpus(8), a_job().gpus(4))

    history.run(cycles=10, every_s=30)

    for job in waiting:
        assert len(history.deferrals(job)) == 1


def test_raising_a_queue_ceiling_lets_the_held_job_start() -> None:
    history = History("2x8:2:1")
    history.team("alpha", max_gpus=8)
    history.submit(a_job().gpus(8).team("alpha"))
    history.run()
    job = history.submit(a_job().gpus(8).team("alpha"))[0]
    history.run()
    assert history.job(job).reason_code == "quota_ceiling"

    history.queue("alpha", max_gpus=None)
    history.run()

    assert history.job(job).state == "running"
    assert [d.code for d in history.deferrals(job)] == ["quota_ceiling"]


def test_the_head_gang_explains_its_earliest_start_and_racks() -> None:
    history = History("4x8:2:2")
    history.submit(*(a_job().gpus(8).estimate(3600) for _ in range(4)))
    history.run()
    head = history.submit(a_job().gpus(8).tasks(2))[0]

    history.run()

    view = history.job(head)
    assert view.reason_code == "reserved_head"
    assert view.reason is not None and "earliest at" in view.reason and " on rack" in view.reason
    assert view.estimated_start is not None


def test_every_waiting_job_has_a_reason_after_a_cycle() -> None:
    history = History("2x8:2:1")
    history.submit(
        *(
            a_job().gpus(g).tasks(t)
            for g, t in [(8, 3), (4, 1), (8, 1), (2, 2), (1, 1), (8, 2), (16, 1)]
        )
    )

    history.run()

    for view in history.state.jobs():
        if view.state == "queued":
            assert view.reason_code and view.reason
            assert history.events(JobDeferred, view.job_id)
