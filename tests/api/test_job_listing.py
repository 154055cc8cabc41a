"""The listing index behind GET /v1/jobs: a team's (or everyone's) jobs, of a state or all, in
submission order, a page at a time, without walking the other jobs of the read model."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.base import Event
from schemas.jobs import JobAdmitted, JobCancelled
from services.api.projections.model import ReadModels
from tests.api.builders import Log, submitted

TEAMS = ("nlp", "vision", "speech")
STATES = (None, "pending", "queued", "cancelled")


def brute_force(models: ReadModels, team: str | None, state: str | None) -> list[str]:
    """What listing answered before it had an index: a scan and a sort of every job."""
    chosen = [
        job
        for job in models.jobs.values()
        if (team is None or job.spec.team == team) and (state is None or job.state == state)
    ]
    return [job.id for job in sorted(chosen, key=lambda job: job.submit_position)]


def every_page(models: ReadModels, team: str | None, state: str | None, limit: int) -> list[str]:
    seen: list[str] = []
    cursor = 0
    while True:
        ids, after = models.listing.page(team, state, cursor, limit)
        assert len(ids) <= limit
        seen += ids
        if after is None:
            return seen
        assert ids and after > cursor
        cursor = after


# Each job: its team and how far it gets (0 submitted, 1 admitted, 2 admitted then cancelled).
jobs = st.lists(st.tuples(st.sampled_from(TEAMS), st.integers(0, 2)), max_size=30)


@settings(max_examples=60, deadline=None)
@given(jobs=jobs, limit=st.integers(1, 7), reorder=st.booleans())
def test_pages_list_exactly_what_a_scan_of_every_job_would(
    jobs: list[tuple[str, int]], limit: int, reorder: bool
) -> None:
    log = Log()
    submissions: list[Event] = []
    changes: list[Event] = []
    for n, (team, progress) in enumerate(jobs):
        job_id = f"j{n}"
        submissions.append(submitted(job_id, team))
        if progress >= 1:
            changes.append(JobAdmitted(job_id=job_id, queue=team, priority="research"))
        if progress == 2:
            changes.append(JobCancelled(job_id=job_id, reason="asked"))
    envelopes = log.record(*submissions, *changes)
    models = ReadModels()
    # The API learns its own appends first and older events later: positions arrive out of
    # order across streams (each stream's own order is kept).
    models.apply_all(reversed(envelopes[: len(submissions)]) if reorder else envelopes)
    if reorder:
        models.apply_all(envelopes[len(submissions) :])
    for scope in (None, *TEAMS):
        for state in STATES:
            assert every_page(models, scope, state, limit) == brute_force(models, scope, state)


def test_a_page_starts_after_its_cursor_and_says_where_the_next_begins() -> None:
    models = ReadModels()
    models.apply_all(Log().record(*(submitted(f"j{n}", "nlp") for n in range(5))))
    first, cursor = models.listing.page("nlp", None, 0, 2)
    assert first == ["j0", "j1"] and cursor == models.jobs["j1"].submit_position
    assert models.listing.page("nlp", None, cursor, 10) == (["j2", "j3", "j4"], None)
    assert models.listing.page("vision", None, 0, 10) == ([], None)
    assert models.listing.page("nlp", "running", 0, 10) == ([], None)
