"""A team's usage report walks only that team's intervals (the book's team index), and says
exactly what walking every team's intervals and keeping that team's rows says.

Found by the last adversarial review: GET /v1/usage with a team's token walked every team's
intervals on each request, so one tenant's polling cost grew with everyone's history
(bench/bench_usage.py: 200 teams of 100 jobs, a team's report 2.05 -> 0.52 ms of CPU).
"""

from __future__ import annotations

from datetime import timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.base import Event
from schemas.jobs import JobAdmitted, JobRequeued, JobSucceeded
from services.api.projections.usage import Bucket, report
from tests.api.builders import node, reserved, submitted
from tests.api.test_usage import MIDNIGHT, Clock, started

TEAMS = ("nlp", "vision", "speech")

# One job: its team, when it is reserved (hours), how many GPUs, how long until all ranks
# run, and how it goes on: still running, succeeded after `hours`, or requeued and reserved
# again after `hours`.
job_strategy = st.tuples(
    st.sampled_from(TEAMS),
    st.floats(0, 200, allow_nan=False),
    st.integers(1, 8),
    st.floats(0, 5, allow_nan=False),
    st.sampled_from(["running", "succeeded", "requeued"]),
    st.floats(0.1, 100, allow_nan=False),
)


def fold(jobs: list[tuple[str, float, int, float, str, float]]) -> Clock:
    clock = Clock()
    clock.at(0, node("n1"))
    timeline: list[tuple[float, int, list[Event]]] = []
    for index, (team, at, gpus, ramp, outcome, hours) in enumerate(jobs):
        job_id = f"j{index}"
        placement = [("n1", list(range(gpus)))]
        timeline.append(
            (
                at,
                index,
                [
                    submitted(job_id, team, tasks=1, gpus_per_task=gpus),
                    JobAdmitted(job_id=job_id, queue=team, priority="research"),
                    reserved(job_id, placement),
                ],
            )
        )
        timeline.append((at + ramp, index, started(job_id, 1)))
        end = at + ramp + hours
        if outcome == "succeeded":
            timeline.append((end, index, [JobSucceeded(job_id=job_id, attempt=1)]))
        elif outcome == "requeued":
            again: list[Event] = [
                JobRequeued(job_id=job_id, attempt=1, code="preempted", reason="x"),
                reserved(job_id, placement, attempt=2),
            ]
            timeline.append((end, index, again))
    for at, _, events in sorted(timeline, key=lambda entry: (entry[0], entry[1])):
        clock.at(at, *events)
    return clock


@settings(max_examples=60, deadline=None)
@given(
    jobs=st.lists(job_strategy, max_size=12),
    start_h=st.floats(0, 300, allow_nan=False),
    span_h=st.floats(1, 400, allow_nan=False),
    by=st.sampled_from(["day", "week"]),
    asked=st.sets(st.sampled_from((*TEAMS, "nobody")), min_size=1),
)
def test_a_teams_report_is_every_teams_report_cut_to_that_team(
    jobs: list[tuple[str, float, int, float, str, float]],
    start_h: float,
    span_h: float,
    by: Bucket,
    asked: set[str],
) -> None:
    book = fold(jobs).models.usage
    start = MIDNIGHT + timedelta(hours=start_h)
    end = start + timedelta(hours=span_h)
    now = MIDNIGHT + timedelta(hours=350)
    everyone = report(book, start=start, end=end, by=by, now=now)
    assert report(book, start=start, end=end, by=by, now=now, teams=asked) == [
        row for row in everyone if row.team in asked
    ]


def test_the_index_holds_each_teams_intervals_and_only_theirs() -> None:
    clock = fold([("nlp", 1, 4, 1, "succeeded", 3), ("vision", 2, 2, 0, "requeued", 1)])
    book = clock.models.usage
    for kind, flat, index in (
        ("allocated", book.allocated, book.allocated_by_team),
        ("used", book.used, book.used_by_team),
    ):
        assert sorted(index) == ["nlp", "vision"], kind
        for team, intervals in index.items():
            assert intervals == [i for i in flat if i.team == team], kind
    assert [i.job_id for i in book.intervals("allocated", {"vision"})] == ["j1", "j1"]
    assert list(book.intervals("used", {"nobody"})) == []
