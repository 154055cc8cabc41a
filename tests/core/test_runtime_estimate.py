"""One runtime estimate for backfill and reservations alike: the user's estimate (a hint,
capped by max_runtime_s), else max_runtime_s, else the policy's default."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from core.estimates import RuntimeEstimates
from core.policy import SchedulingPolicy
from core.reservation import (
    MAX_PLANNED_RUNTIME_S,
    _runtime_estimate,
    runtime_estimate,
    runtime_estimator,
)
from core.state import CoreJob
from schemas.jobs import GangReserved, JobSpec, JobSubmitted, JobSucceeded, RankPlacement
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


def test_a_kept_estimate_moves_with_the_learning_the_estimator_the_policy_and_the_spec() -> None:
    """Each job's estimate is kept while nothing it rests on changes (a cycle asks it for
    every gang): it must move the moment the estimator learns, another estimator (a replayed
    one) or another policy is asked, or the job's spec is updated."""
    history, elsewhere = History("1x8"), History("1x8")
    for _ in range(3):
        for where, ran in ((history, HOUR), (elsewhere, 2 * HOUR)):
            job_id = where.submit(a_job().named("train").gpus(1))[0]
            where.run()
            where.advance(ran)
            where.exit(job_id, 0)
            where.run()
    probe = history.submit(a_job().named("train").gpus(1))[0]
    history.run()
    job = history.state.job_records[probe]
    estimates, policy = history.state.estimates, history.policy

    learned = runtime_estimate(job, policy, estimates)
    assert HOUR <= learned <= HOUR + 10
    assert runtime_estimate(job, policy, estimates) == learned  # kept, the same
    # Another estimator that learned as many jobs, other runtimes: its own answer.
    assert elsewhere.state.estimates.learned == estimates.learned
    assert runtime_estimate(job, policy, elsewhere.state.estimates) >= 2 * HOUR

    nothing_learned = RuntimeEstimates()
    assert runtime_estimate(job, policy, nothing_learned) == policy.default_runtime_estimate_s
    shorter_default = replace(policy, default_runtime_estimate_s=HOUR / 2)
    assert runtime_estimate(job, shorter_default, nothing_learned) == HOUR / 2
    assert runtime_estimate(job, policy, estimates) == learned

    assert job.spec is not None
    limited = replace(job, spec=job.spec.model_copy(update={"max_runtime_s": 600.0}))
    assert runtime_estimate(limited, policy, estimates) == 600.0

    for _ in range(3):
        job_id = history.submit(a_job().named("train").gpus(1))[0]
        history.run()
        history.advance(3 * HOUR)
        history.exit(job_id, 0)
        history.run()
    assert runtime_estimate(job, policy, estimates) > learned


def test_an_estimator_for_one_pass_answers_as_runtime_estimate_asked_job_by_job() -> None:
    """`runtime_estimator` checks once whether the kept estimates hold (backfill asks for
    thousands of jobs in one cycle): each answer is `runtime_estimate`'s, one made after the
    estimator learned gives the new answers, and so does one for another estimator, another
    policy, or a policy that learns nothing."""
    history = History("2x8:2:1")
    jobs: list[str] = []
    for ran in (HOUR, 2 * HOUR):
        job_id = history.submit(a_job().named("train").gpus(1))[0]
        history.run()
        history.advance(ran)
        history.exit(job_id, 0)
        history.run()
    jobs = history.submit(
        a_job().named("train").gpus(1),
        a_job().named("train").gpus(2).estimate(600),
        a_job().named("eval").gpus(1).max_runtime(HOUR),
        a_job().gpus(1),
    )
    records = history.state.job_records
    estimates, policy = history.state.estimates, history.policy

    def agree(estimates: RuntimeEstimates | None, policy: SchedulingPolicy) -> list[float]:
        estimate = runtime_estimator(policy, estimates)
        answers = [estimate(records[job_id]) for job_id in jobs]
        assert answers == [runtime_estimate(records[j], policy, estimates) for j in jobs]
        assert answers == [estimate(records[job_id]) for job_id in jobs]  # kept, the same
        return answers

    before = agree(estimates, policy)
    agree(RuntimeEstimates(), policy)
    agree(None, policy)
    agree(estimates, replace(policy, default_runtime_estimate_s=HOUR / 2))
    agree(estimates, replace(policy, learned_runtimes=False))
    for _ in range(3):
        job_id = history.submit(a_job().named("train").gpus(1))[0]
        history.run()
        history.advance(5 * HOUR)
        history.exit(job_id, 0)
        history.run()
    after = agree(estimates, policy)
    assert after[0] > before[0]  # learned: the kept answers did not stand


def test_estimators_for_two_policies_made_in_one_pass_keep_their_own_answers() -> None:
    """Each estimator answers for its own policy, even when another was made in between (the
    kept estimates of one policy are no other's): a job with nothing learned to go by takes
    each policy's default."""
    history = History("1x8")
    job_id = history.submit(a_job().gpus(1))[0]
    job = history.state.job_records[job_id]
    nothing_learned = RuntimeEstimates()
    policies = [replace(history.policy, default_runtime_estimate_s=s) for s in (HOUR, 2 * HOUR)]
    estimators = [runtime_estimator(policy, nothing_learned) for policy in policies]
    assert [estimate(job) for estimate in estimators] == [HOUR, 2 * HOUR]
    assert [estimate(job) for estimate in reversed(estimators)] == [2 * HOUR, HOUR]


# A probe's (team, given estimate, limit); the finished jobs' (team, given estimate, ran).
_probes = st.lists(
    st.tuples(
        st.sampled_from(("a", "b", "c")),
        st.sampled_from((None, 600.0, 3600.0)),
        st.sampled_from((None, 1800.0, 7200.0)),
    ),
    min_size=1,
    max_size=12,
)
_finished = st.lists(
    st.tuples(
        st.sampled_from(("a", "b")),
        st.sampled_from((None, 600.0, 3600.0)),
        st.floats(min_value=60.0, max_value=20_000.0),
    ),
    max_size=24,
)


@settings(max_examples=60, deadline=None)
@given(probes=_probes, finished=_finished, ask_every=st.integers(1, 4))
def test_one_kept_estimate_per_team_estimate_and_limit_answers_as_each_job_alone(
    probes: list[tuple[str, float | None, float | None]],
    finished: list[tuple[str, float | None, float]],
    ask_every: int,
) -> None:
    """Jobs with a given estimate share one kept answer per (team, estimate, limit): each
    job's answer must be the one worked out for it alone, for jobs of every team, estimate and
    limit, asked in any order, as the estimator learns between passes (teams' ratios move)."""
    policy = SchedulingPolicy()
    estimates = RuntimeEstimates()
    jobs = [
        CoreJob(
            job_id=f"p{number}",
            seq=number,
            spec=JobSpec(
                name="probe",
                team=team,
                gpus_per_task=1,
                estimated_runtime_s=estimate
                if estimate is None or limit is None
                else min(estimate, limit),
                max_runtime_s=limit,
            ),
            state="queued",
            shape=None,
            submitted_at=0.0,
            team=team,
        )
        for number, (team, estimate, limit) in enumerate(probes)
    ]
    now = 0.0

    def agree() -> None:
        estimate = runtime_estimator(policy, estimates)
        for job in [*jobs, *reversed(jobs)]:
            alone = min(_runtime_estimate(job, policy, estimates), MAX_PLANNED_RUNTIME_S)
            assert estimate(job) == alone
            assert runtime_estimate(job, policy, estimates) == alone

    agree()
    for number, (team, estimate, ran_s) in enumerate(finished):
        job_id = f"f{number}"
        spec = JobSpec(name="train", team=team, gpus_per_task=1, estimated_runtime_s=estimate)
        placement = RankPlacement(rank=0, node_id="n1", gpus=[0])
        estimates.apply(JobSubmitted(job_id=job_id, spec=spec, submitted_by="test"), now)
        estimates.apply(GangReserved(job_id=job_id, attempt=1, ranks=[placement]), now)
        now += ran_s
        estimates.apply(JobSucceeded(job_id=job_id, attempt=1), now)
        if number % ask_every == 0:
            agree()
    agree()
