"""The submit path's fair share (core/submit_share.py): a team alone may use all of it; while
others submit too, the shared rate is split max-min fairly, so a team that submits little is
never held back by another's flood, and the flood is held to what the others leave."""

from __future__ import annotations

import pytest

from core.submit_share import PRESENCE_S, RecentSubmissions, budget_wait, share_wait

# A budget of 100 jobs in the one-second window.
RATE = 100.0


def recent(*jobs: tuple[str, int, float]) -> RecentSubmissions:
    """(team, how many jobs, when) in time order."""
    book = RecentSubmissions(window_s=1.0)
    for team, count, at in jobs:
        for _ in range(count):
            book.add(team, at)
    return book


def test_a_team_alone_is_never_held_however_much_it_submits() -> None:
    book = recent(("cv", 10_000, 0.0))
    assert share_wait(book, "cv", 1_000, RATE, now=0.5) is None


def test_while_another_team_submits_a_flood_is_held_to_what_the_others_leave() -> None:
    book = recent(("nlp", 1, 0.0), ("cv", 99, 0.1))
    assert share_wait(book, "cv", 1, RATE, now=0.2) is not None
    # One job fewer and the flood's next one fits: 99 + 1 of the 100 the quiet team leaves.
    book = recent(("nlp", 1, 0.0), ("cv", 98, 0.1))
    assert share_wait(book, "cv", 1, RATE, now=0.2) is None


@pytest.mark.parametrize("flood", [50, 99, 5_000])
def test_a_quiet_team_gets_its_equal_share_whatever_the_flood_took(flood: int) -> None:
    book = recent(("cv", flood, 0.0), ("nlp", 49, 0.1))
    assert share_wait(book, "nlp", 1, RATE, now=0.2) is None
    assert share_wait(book, "nlp", 2, RATE, now=0.2) is not None  # past its half


def test_a_team_with_nothing_in_the_window_may_submit_a_batch_past_its_share() -> None:
    book = recent(("nlp", 1, 0.0))
    assert share_wait(book, "cv", 1_000, RATE, now=0.1) is None


def test_the_wait_is_until_enough_of_the_teams_own_jobs_have_left_the_window() -> None:
    book = recent(("nlp", 1, 0.0), ("cv", 60, 0.2), ("cv", 39, 0.5))
    # 99 + 10 is 10 past the 99 left: the tenth oldest of cv's jobs (at 0.2) leaves at 1.2.
    assert share_wait(book, "cv", 10, RATE, now=0.6) == pytest.approx(0.6)
    # Past 1.2 those 60 have left, and there is room again.
    assert share_wait(book, "cv", 10, RATE, now=1.25) is None


def test_jobs_let_through_and_not_yet_recorded_count_as_the_teams() -> None:
    book = recent(("nlp", 1, 0.0), ("cv", 50, 0.1))
    assert share_wait(book, "cv", 40, RATE, now=0.2) is None
    assert share_wait(book, "cv", 40, RATE, now=0.2, in_flight=40) is not None


def test_a_team_that_stopped_submitting_stops_holding_the_others() -> None:
    book = recent(("nlp", 1, 0.0), ("cv", 100, 0.1))
    assert share_wait(book, "cv", 1, RATE, now=0.5) is not None
    # nlp's job left the window long ago, but a team submitting every few seconds still counts.
    assert share_wait(book, "cv", 200, RATE, now=PRESENCE_S - 0.5) is None  # cv's left too
    book.add("cv", PRESENCE_S - 0.4)
    assert share_wait(book, "cv", 200, RATE, now=PRESENCE_S - 0.3) is not None
    assert share_wait(book, "cv", 200, RATE, now=PRESENCE_S + 0.1) is None


def test_no_shared_rate_holds_nobody() -> None:
    book = recent(("nlp", 1, 0.0), ("cv", 5_000, 0.1))
    assert share_wait(book, "cv", 1_000, None, now=0.2) is None


def test_three_teams_each_keep_a_third_and_the_idle_share_goes_to_whoever_uses_it() -> None:
    book = recent(("a", 1, 0.0), ("b", 1, 0.0), ("c", 70, 0.1))
    # a and b leave 98: c may take them.
    assert share_wait(book, "c", 28, RATE, now=0.2) is None
    assert share_wait(book, "c", 29, RATE, now=0.2) is not None
    # b and c leave a 29, fewer than a third of the 100: a may still take its third.
    assert share_wait(book, "a", 32, RATE, now=0.2) is None
    assert share_wait(book, "a", 33, RATE, now=0.2) is not None


def test_a_teams_own_jobs_per_second_holds_it_alone_too_counting_each_job() -> None:
    book = recent(("cv", 8, 0.0))
    assert budget_wait(book, "cv", 2, 10.0, now=0.5) is None
    assert budget_wait(book, "cv", 3, 10.0, now=0.5) == pytest.approx(0.5)
    assert budget_wait(book, "cv", 2, 10.0, now=0.5, in_flight=1) is not None
    # Others' jobs are not its own; with nothing in the window a batch past it passes.
    assert budget_wait(book, "nlp", 50, 10.0, now=0.5) is None
    assert budget_wait(book, "cv", 3, None, now=0.5) is None
