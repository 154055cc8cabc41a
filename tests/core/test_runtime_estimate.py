"""One runtime estimate for backfill and reservations alike: the user's estimate (a hint,
capped by max_runtime_s), else max_runtime_s, else the policy's default."""

from __future__ import annotations

from tests.core.builders import History, a_job

HOUR = 3600.0


def test_a_gang_with_only_a_max_runtime_is_planned_to_hold_its_gpus_until_that_max() -> None:
    # The running gang gives no estimate, only a 10 h limit. The head's reservation must count
    # it as the backfill does, 10 h (not the 4 h default): so a 6 h job ends before the
    # head's start and backfills, and the head's estimated start is 10 h after the gang's.
    history = History("2x8:2:1")
    limited = history.submit(a_job().gpus(4).max_runtime(10 * HOUR))[0]
    history.run()
    head = history.submit(a_job().gpus(8).tasks(2).estimate(600))[0]
    history.run()
    six_hours = history.submit(a_job().gpus(4).estimate(6 * HOUR))[0]

    history.run()

    started = history.job(limited).started_at
    assert started is not None
    assert history.job(head).estimated_start == started + 10 * HOUR
    assert history.job(six_hours).state == "running"
