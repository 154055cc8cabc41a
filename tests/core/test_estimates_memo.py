"""The estimator's memos (which key speaks for each live job, each team's ratio, an overrunning
gang's expected length) change no prediction: asked at any moment of any log, it predicts
exactly what a fresh estimator replaying the same log predicts, for every job still live,
before and past its estimate; and it says which predictions may have moved since a moment
(`teams_learned_since`, `reads_own_team`: core/estimates.py)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from core.estimates import RuntimeEstimates
from schemas.base import Event
from schemas.jobs import GangReserved, JobFailed, JobSpec, JobSubmitted, JobSucceeded, RankPlacement

NAMES = ("bert-1", "bert-2", "resnet", "gpt-a", "gpt-b")

jobs = st.tuples(
    st.sampled_from(NAMES),
    st.sampled_from(("a", "b")),
    st.sampled_from((1, 2, 8)),
    st.sampled_from((None, 600.0)),
    st.floats(min_value=10.0, max_value=5000.0),
    st.sampled_from(("succeeded", "failed", "running")),
)


def predictions(estimates: RuntimeEstimates, live: dict[str, JobSpec]) -> list[object]:
    return [
        (
            estimates.remaining_s(job_id, spec),
            estimates.beyond_s(job_id, spec, 300.0),
            estimates.beyond_s(job_id, spec, 3000.0),
        )
        for job_id, spec in sorted(live.items())
    ]


@settings(max_examples=80, deadline=None)
@given(plan=st.lists(jobs, min_size=1, max_size=40), ask_every=st.integers(1, 4))
def test_a_kept_estimator_predicts_what_a_fresh_replay_predicts(
    plan: list[tuple[str, str, int, float | None, float, str]], ask_every: int
) -> None:
    kept = RuntimeEstimates()
    log: list[tuple[Event, float]] = []
    live: dict[str, JobSpec] = {}
    now = 0.0
    for number, (name, team, gpus, estimate, ran_s, end) in enumerate(plan):
        job_id = f"j{number}"
        spec = JobSpec(name=name, team=team, gpus_per_task=gpus, estimated_runtime_s=estimate)
        placement = RankPlacement(rank=0, node_id="n1", gpus=list(range(gpus)))
        events: list[tuple[Event, float]] = [
            (JobSubmitted(job_id=job_id, spec=spec, submitted_by="test"), now),
            (GangReserved(job_id=job_id, attempt=1, ranks=[placement]), now),
        ]
        now += ran_s
        if end == "succeeded":
            events.append((JobSucceeded(job_id=job_id, attempt=1), now))
        elif end == "failed":
            events.append((JobFailed(job_id=job_id, attempt=1, reason="exit 1"), now))
        else:
            live[job_id] = spec
        for event, at in events:
            kept.apply(event, at)
        log += events
        if number % ask_every == 0:
            fresh = RuntimeEstimates()
            for event, at in log:
                fresh.apply(event, at)
            assert predictions(kept, live) == predictions(fresh, live)


@settings(max_examples=80, deadline=None)
@given(plan=st.lists(jobs, min_size=1, max_size=40), ask_every=st.integers(1, 4))
def test_a_prediction_moves_only_where_the_estimator_says_it_may_have(
    plan: list[tuple[str, str, int, float | None, float, str]], ask_every: int
) -> None:
    estimates = RuntimeEstimates()
    live: dict[str, JobSpec] = {}
    asked: tuple[int, dict[str, float | None]] = (0, {})
    now = 0.0
    for number, (name, team, gpus, estimate, ran_s, end) in enumerate(plan):
        job_id = f"j{number}"
        spec = JobSpec(name=name, team=team, gpus_per_task=gpus, estimated_runtime_s=estimate)
        placement = RankPlacement(rank=0, node_id="n1", gpus=list(range(gpus)))
        estimates.apply(JobSubmitted(job_id=job_id, spec=spec, submitted_by="test"), now)
        estimates.apply(GangReserved(job_id=job_id, attempt=1, ranks=[placement]), now)
        now += ran_s
        if end == "succeeded":
            estimates.apply(JobSucceeded(job_id=job_id, attempt=1), now)
        elif end == "failed":
            estimates.apply(JobFailed(job_id=job_id, attempt=1, reason="exit 1"), now)
        else:
            live[job_id] = spec
        if number % ask_every:
            continue
        learned, before = asked
        teams = estimates.teams_learned_since(learned)
        for job_id, spec in live.items():
            if (
                job_id in before
                and spec.team not in teams
                and estimates.reads_own_team(job_id, spec)
            ):
                assert estimates.remaining_s(job_id, spec) == before[job_id]
        asked = (
            estimates.learned,
            {job_id: estimates.remaining_s(job_id, spec) for job_id, spec in live.items()},
        )


def test_a_learn_moves_its_own_teams_predictions_and_those_read_from_every_teams_keys() -> None:
    estimates = RuntimeEstimates()
    now = 0.0

    def run(job_id: str, team: str, name: str, ran_s: float, estimate: float | None) -> None:
        nonlocal now
        spec = JobSpec(name=name, team=team, gpus_per_task=1, estimated_runtime_s=estimate)
        estimates.apply(JobSubmitted(job_id=job_id, spec=spec, submitted_by="test"), now)
        estimates.apply(
            GangReserved(
                job_id=job_id, attempt=1, ranks=[RankPlacement(rank=0, node_id="n1", gpus=[0])]
            ),
            now,
        )
        now += ran_s
        estimates.apply(JobSucceeded(job_id=job_id, attempt=1), now)

    for number in range(3):
        run(f"a{number}", "a", "train", 100.0, 50.0)
    learned = estimates.learned
    # Team a's keys and ratio had matured: one more of a's jobs moves a's predictions only.
    run("a3", "a", "train", 400.0, 50.0)
    assert estimates.teams_learned_since(learned) == frozenset({"a"})
    assert estimates.teams_learned_since(estimates.learned) == frozenset()
    # Team b has learned nothing: a job without an estimate reads what every team feeds
    # (the "gpus" key), one with an estimate everyone's ratio.
    b_named = JobSpec(name="eval", team="b", gpus_per_task=1)
    b_estimated = JobSpec(name="eval", team="b", gpus_per_task=1, estimated_runtime_s=60.0)
    a_named = JobSpec(name="train", team="a", gpus_per_task=1)
    assert not estimates.reads_own_team("b1", b_named)
    assert not estimates.reads_own_team("b2", b_estimated)
    assert estimates.reads_own_team("a9", a_named)
    a_estimated = JobSpec(name="x", team="a", gpus_per_task=1, estimated_runtime_s=60.0)
    assert estimates.reads_own_team("a8", a_estimated)  # team a's own ratio speaks
    # Team c's own keys mature: its jobs read them from then on.
    c_named = JobSpec(name="other", team="c", gpus_per_task=1)
    assert not estimates.reads_own_team("c9", c_named)
    for number in range(3):
        run(f"c{number}", "c", "other", 10.0, None)
    assert estimates.teams_learned_since(learned) == frozenset({"a", "c"})
    assert estimates.reads_own_team("c9", c_named)
