"""Periodic checkpoints: due every interval while the gang runs, never after it stopped."""

from __future__ import annotations

from services.checkpoint.periodic import PeriodicCheckpoints


def test_a_gang_is_due_one_interval_after_it_started_and_every_interval_after() -> None:
    periodic = PeriodicCheckpoints()
    periodic.started("j1", 1, 60.0, now=0.0)
    assert periodic.due(59.0) == []
    assert periodic.due(60.0) == [("j1", 1)]
    assert periodic.due(90.0) == []
    assert periodic.due(120.0) == [("j1", 1)]


def test_a_late_round_asks_once_not_for_every_missed_interval() -> None:
    periodic = PeriodicCheckpoints()
    periodic.started("j1", 1, 10.0, now=0.0)
    assert periodic.due(55.0) == [("j1", 1)]
    assert periodic.due(56.0) == []


def test_a_job_without_an_interval_is_never_due() -> None:
    periodic = PeriodicCheckpoints()
    periodic.started("j1", 1, None, now=0.0)
    assert periodic.due(1e9) == []


def test_a_released_gang_is_no_longer_due() -> None:
    periodic = PeriodicCheckpoints()
    periodic.started("j1", 1, 10.0, now=0.0)
    periodic.stopped("j1", 1)
    assert periodic.due(100.0) == []


def test_releasing_an_older_attempt_keeps_the_current_one() -> None:
    periodic = PeriodicCheckpoints()
    periodic.started("j1", 2, 10.0, now=0.0)
    periodic.stopped("j1", 1)
    assert periodic.due(10.0) == [("j1", 2)]


def test_an_interval_below_the_clusters_minimum_is_raised_to_it() -> None:
    periodic = PeriodicCheckpoints(min_interval_s=60.0)
    periodic.started("j1", 1, 0.2, now=0.0)
    assert [periodic.due(t / 10) for t in range(1, 600)] == [[]] * 599
    assert periodic.due(60.0) == [("j1", 1)]


def test_a_request_never_recorded_is_due_again_at_once() -> None:
    periodic = PeriodicCheckpoints()
    periodic.started("j1", 1, 60.0, now=0.0)
    assert periodic.due(60.0) == [("j1", 1)]
    periodic.missed("j1", 1)
    assert periodic.due(61.0) == [("j1", 1)]
    assert periodic.due(62.0) == []  # recorded this time: one interval on


def test_a_missed_request_of_an_ended_attempt_stays_off() -> None:
    periodic = PeriodicCheckpoints()
    periodic.started("j1", 1, 60.0, now=0.0)
    assert periodic.due(60.0) == [("j1", 1)]
    periodic.started("j1", 2, 60.0, now=60.5)
    periodic.missed("j1", 1)
    assert periodic.due(61.0) == []
