"""The estimator keeps, per live job, which key speaks for it, and re-resolves it only when one
of the job's own keys reached MIN_SAMPLES since (core/estimates.py): asked at any moment of any
log, it predicts exactly what a fresh estimator replaying the same log predicts, for every job
still live, before and past its estimate."""

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
