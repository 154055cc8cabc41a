"""Runtime estimates learned from the log (core/estimates.py): jobs like a finished one are
predicted to run as long; the head's reservation, backfill and `why`'s estimated start use the
prediction; a replay predicts the same; an estimate is never a limit."""

from __future__ import annotations

import pytest

from core.estimates import RuntimeEstimates, name_prefix, predicted_runtime_s
from core.policy import SchedulingPolicy
from core.reservation import estimated_end, has_overrun, runtime_estimate
from schemas.jobs import JobSpec, PreemptionRequested, ReservationPlanned
from tests.core.builders import History, a_job

HOUR = 3600.0


def finish(history: History, job_id: str, after_s: float) -> None:
    """The job's gang runs `after_s` seconds, then its ranks exit 0 and it succeeds."""
    history.run()
    history.advance(after_s)
    history.exit(job_id, 0)
    history.run()


def run_jobs(history: History, builders: list[tuple[str, float]], team: str = "team-a") -> None:
    """(name, seconds) jobs of one GPU, one after the other, each succeeding after its time."""
    for name, seconds in builders:
        job = history.submit(a_job().named(name).gpus(1).team(team))[0]
        finish(history, job, seconds)
        assert history.job(job).state == "succeeded"


def spec(name: str, team: str = "team-a", gpus: int = 1, **fields: object) -> JobSpec:
    return JobSpec.model_validate({"name": name, "team": team, "gpus_per_task": gpus, **fields})


def test_a_job_run_again_is_predicted_to_run_as_long_as_its_last_runs() -> None:
    history = History("1x8")
    run_jobs(history, [("train", HOUR), ("train", HOUR), ("train", HOUR)])

    predicted = predicted_runtime_s(history.state.estimates, spec("train"))

    assert predicted is not None
    assert HOUR <= predicted <= HOUR + 10  # the gang held its GPUs an hour (and a cycle)


def test_nothing_is_predicted_before_enough_jobs_ended() -> None:
    history = History("1x8")
    run_jobs(history, [("train", HOUR), ("train", HOUR)])

    assert predicted_runtime_s(history.state.estimates, spec("train")) is None
    assert predicted_runtime_s(RuntimeEstimates(), spec("train")) is None


def test_an_unknown_name_falls_back_to_its_prefix_then_its_team_then_everyone() -> None:
    history = History("1x8")
    run_jobs(history, [("bert-base-1", 600.0), ("bert-base-2", 600.0), ("bert-large", 600.0)])
    run_jobs(history, [("etl", 2 * HOUR), ("etl", 2 * HOUR), ("etl", 2 * HOUR)], team="team-b")
    estimates = history.state.estimates

    by_prefix = predicted_runtime_s(estimates, spec("bert-large-lr3"))
    by_team = predicted_runtime_s(estimates, spec("gpt"))
    by_everyone = predicted_runtime_s(estimates, spec("anything", team="team-c", gpus=4))

    assert by_prefix is not None and by_prefix < HOUR
    assert by_team is not None and by_team < HOUR  # team-a's jobs, not team-b's
    assert by_everyone is not None and by_everyone > HOUR  # the 0.6 quantile of all six


def test_a_name_prefix_is_the_stem_before_a_separator_or_a_trailing_number() -> None:
    assert name_prefix("bert-large-lr3") == "bert"
    assert name_prefix("resnet50_seed7") == "resnet50"
    assert name_prefix("train7") == "train"
    assert name_prefix("train") is None
    assert name_prefix("7-up") is None


def test_a_teams_estimates_are_scaled_by_how_far_they_were_off() -> None:
    """The team's users say an hour and their jobs run two: an hour now means two."""
    history = History("1x8")
    for _ in range(3):
        job = history.submit(a_job().named("sweep").gpus(1).estimate(HOUR))[0]
        finish(history, job, 2 * HOUR)

    predicted = predicted_runtime_s(history.state.estimates, spec("new", estimated_runtime_s=HOUR))
    capped = predicted_runtime_s(
        history.state.estimates,
        spec("new", estimated_runtime_s=HOUR, max_runtime_s=1.5 * HOUR),
    )

    assert predicted is not None and 2 * HOUR <= predicted <= 2 * HOUR + 10
    assert capped == 1.5 * HOUR  # only max_runtime_s ends a job: nothing is planned past it


def test_a_cancelled_job_teaches_nothing_a_failed_one_does() -> None:
    history = History("1x8")
    for _ in range(3):
        job = history.submit(a_job().named("flaky").gpus(1))[0]
        history.run()
        history.advance(HOUR)
        history.cancel(job)
        history.run(cycles=2)
    assert predicted_runtime_s(history.state.estimates, spec("flaky")) is None

    for _ in range(3):
        job = history.submit(a_job().named("flaky").gpus(1).retries(0))[0]
        finish_code(history, job, 600.0, code=1)
        assert history.job(job).state == "failed"
    predicted = predicted_runtime_s(history.state.estimates, spec("flaky"))
    assert predicted is not None and predicted < HOUR


def cancel_after(history: History, job_id: str, after_s: float) -> None:
    """The job's gang runs `after_s` seconds, then its owner cancels it."""
    history.run()
    history.advance(after_s)
    history.cancel(job_id)
    history.run(cycles=2)
    assert history.job(job_id).state == "cancelled"


def test_a_long_run_cancelled_counts_as_it_ran_an_early_cancel_shortens_nothing() -> None:
    """A cancelled run is a lower bound: the job would have run at least that long. It is
    learned where it raises a prediction, never where it would lower one."""
    history = History("1x8")
    run_jobs(history, [("train", HOUR)] * 3)
    before = predicted_runtime_s(history.state.estimates, spec("train"))
    assert before is not None

    for _ in range(5):  # cancelled a minute in: a typo, or a team angling for a short estimate
        cancel_after(history, history.submit(a_job().named("train").gpus(1))[0], 60.0)
    assert predicted_runtime_s(history.state.estimates, spec("train")) == before
    assert predicted_runtime_s(history.state.estimates, spec("new")) == before  # the team's too

    for _ in range(3):  # cancelled after three hours: they do run that long
        cancel_after(history, history.submit(a_job().named("train").gpus(1))[0], 3 * HOUR)
    after = predicted_runtime_s(history.state.estimates, spec("train"))
    assert after is not None and after >= 3 * HOUR


def test_a_team_that_under_estimates_and_cancels_or_fails_is_corrected() -> None:
    """Found by the hostile-tenant run (2026-11-23): only succeeded jobs scaled a team's
    estimates, so a team that said a minute and cancelled (or failed) after two hours was
    planned at a minute forever. A run it cut short (or that failed) ran at least that long:
    its ratio to the estimate scales the team's estimates as a success's would."""
    for end in ("cancelled", "failed"):
        history = History("1x8")
        for _ in range(3):
            job = history.submit(
                a_job().named("liar").team("team-b").gpus(1).estimate(60).retries(0)
            )[0]
            if end == "cancelled":
                cancel_after(history, job, 2 * HOUR)
            else:
                finish_code(history, job, 2 * HOUR, code=1)
                assert history.job(job).state == "failed"
        says_a_minute = spec("other", team="team-b", estimated_runtime_s=60)
        predicted = predicted_runtime_s(history.state.estimates, says_a_minute)
        assert predicted is not None and predicted >= 2 * HOUR, end


def test_a_cancel_that_moves_only_its_teams_ratio_is_seen_as_learned_from_that_team() -> None:
    """The scheduler re-plans a team's jobs only when `teams_learned_since` names the team; a
    cancel that raised nothing but the team's ratio (no key of its runtime predicts yet) must
    name it too, or a waiting job of the team that gives an estimate keeps its old plan."""
    history = History("1x8")
    for _ in range(2):
        job = history.submit(a_job().named("liar").team("team-b").gpus(1).estimate(60))[0]
        cancel_after(history, job, 2 * HOUR)
    estimates = history.state.estimates
    before = estimates.learned
    job = history.submit(a_job().named("liar").team("team-b").gpus(1).estimate(60))[0]
    cancel_after(history, job, 2 * HOUR)

    assert predicted_runtime_s(estimates, spec("liar")) is None  # no runtime key speaks
    assert estimates.teams_learned_since(before) == {"team-b"}


def test_a_team_that_under_estimates_and_cancels_no_longer_backfills_before_the_head() -> None:
    """The liar's job says a minute; its earlier ones said so too and were cancelled after two
    hours. It no longer starts on the GPUs reserved for another team's head, which is planned
    to start in an hour; an honest job of a minute still does. A replayed scheduler agrees."""
    history = History("2x8:2:1")
    history.team("team-b")
    run_jobs(history, [("train", HOUR)] * 3 + [("probe", 60.0)] * 3)
    for _ in range(3):
        job = history.submit(a_job().named("sweep").team("team-b").gpus(1).estimate(60))[0]
        cancel_after(history, job, 2 * HOUR)
    history.submit(a_job().named("train").gpus(4))
    history.run()
    head = history.submit(a_job().named("big").gpus(8).tasks(2))[0]
    history.run()
    assert history.job(head).reason_code == "reserved_head"

    liar = history.submit(a_job().named("sweep-2").team("team-b").gpus(4).estimate(60))[0]
    honest = history.submit(a_job().named("probe").gpus(4))[0]
    history.run()

    assert history.job(liar).state == "queued"
    assert history.job(liar).reason_code == "backfill_blocked"
    assert history.job(honest).state == "running"
    replayed = history.replayed()
    for job_id in (liar, head):
        assert runtime_estimate(
            replayed.job_records[job_id], history.policy, replayed.estimates
        ) == runtime_estimate(
            history.state.job_records[job_id], history.policy, history.state.estimates
        )


def finish_code(history: History, job_id: str, after_s: float, code: int) -> None:
    history.run()
    history.advance(after_s)
    history.exit(job_id, code)
    history.run(cycles=2)


def test_the_head_reservation_and_its_estimated_start_follow_learned_runtimes() -> None:
    """Nobody gave an estimate: the running `train` is expected to end after the hour such
    jobs ran, not after the policy's default of four hours, and `why` says so."""
    history = History("1x8")
    run_jobs(history, [("train", HOUR), ("train", HOUR), ("train", HOUR)])
    running = history.submit(a_job().named("train").gpus(8))[0]
    history.run()
    started = history.now - 1
    head = history.submit(a_job().named("eval").gpus(8))[0]

    history.run()

    view = history.job(head)
    assert view.reason_code == "reserved_head"
    assert view.estimated_start is not None
    assert started + HOUR <= view.estimated_start <= started + HOUR + 10
    assert history.job(running).state == "running"


def test_without_learning_the_head_waits_for_the_policys_default_estimate() -> None:
    history = History("1x8", policy=SchedulingPolicy(learned_runtimes=False))
    run_jobs(history, [("train", HOUR), ("train", HOUR), ("train", HOUR)])
    history.submit(a_job().named("train").gpus(8))
    history.run()
    started = history.now - 1
    head = history.submit(a_job().named("eval").gpus(8))[0]

    history.run()

    assert history.job(head).estimated_start == started + 4 * HOUR


def test_a_job_learned_short_backfills_before_the_reservation() -> None:
    """`probe` jobs ran ten minutes: one may start on the head's reserved GPUs, which stay
    busy for the hour `train` runs; a job only known by its team's runs (the 0.6 quantile of
    ten minutes and an hour: an hour) may not."""
    history = History("2x8:2:1")
    run_jobs(history, [("probe", 600.0)] * 3 + [("train", HOUR)] * 3)
    history.submit(a_job().named("train").gpus(4))
    history.run()
    head = history.submit(a_job().named("big").gpus(8).tasks(2))[0]
    history.run()
    assert history.job(head).reason_code == "reserved_head"

    probe = history.submit(a_job().named("probe").gpus(4))[0]
    unknown = history.submit(a_job().named("other").gpus(4))[0]
    history.run()

    assert history.job(probe).state == "running"
    assert history.job(unknown).state == "queued"
    assert history.job(unknown).reason_code == "backfill_blocked"


def test_an_overrun_replans_the_reservation_from_jobs_that_ran_as_long() -> None:
    """Most `train` runs took an hour, a third three: one past its hour is not evicted; the
    head behind it is planned again for when such long runs ended."""
    history = History("1x8")
    run_jobs(history, [("train", HOUR), ("train", HOUR), ("train", 3 * HOUR)] * 2)
    running = history.submit(a_job().named("train").gpus(8).priority("best-effort"))[0]
    history.run()
    started = history.now - 1
    head = history.submit(a_job().named("eval").gpus(8).priority("research"))[0]
    history.run()
    first = history.job(head).estimated_start
    assert first is not None and first < started + 1.1 * HOUR

    history.run(cycles=4, every_s=HOUR / 2)

    assert history.events(PreemptionRequested, running) == []
    assert history.job(running).state == "running"
    planned = history.events(ReservationPlanned, head)[-1].start_at.timestamp()
    assert started + 3 * HOUR <= planned <= started + 3 * HOUR + 10


def test_a_restarted_scheduler_replaying_the_log_predicts_the_same() -> None:
    history = History("2x8:2:1")
    history.team("team-b")
    run_jobs(history, [("bert-a", 600.0), ("bert-b", 900.0), ("etl", HOUR)] * 2)
    for _ in range(3):
        job = history.submit(a_job().named("sweep").team("team-b").gpus(2).estimate(HOUR))[0]
        finish(history, job, 1.5 * HOUR)
    waiting = history.submit(
        a_job().named("bert-c").gpus(8).tasks(2),
        a_job().named("sweep").team("team-b").gpus(8).estimate(600),
        a_job().named("etl").gpus(4),
    )
    history.run()

    replayed = history.replayed()

    policy = history.policy
    for job_id in waiting:
        live_job = history.state.job_records[job_id]
        replayed_job = replayed.job_records[job_id]
        assert runtime_estimate(replayed_job, policy, replayed.estimates) == runtime_estimate(
            live_job, policy, history.state.estimates
        )
    for probe in (spec("bert-z"), spec("sweep", team="team-b", estimated_runtime_s=60), spec("x")):
        assert predicted_runtime_s(replayed.estimates, probe) == predicted_runtime_s(
            history.state.estimates, probe
        )
    assert replayed.estimates.learned == history.state.estimates.learned == 9


def test_an_overrunning_gangs_expected_end_does_not_depend_on_when_it_was_asked() -> None:
    """The live scheduler asks every cycle, a restarted one once: both get the same answer."""
    history = History("1x8")
    run_jobs(history, [(f"train-{n}", n * 900.0) for n in range(1, 9)])
    running = history.submit(a_job().named("train-9").gpus(8))[0]
    history.run()
    live = history.state.estimates
    spec_of = history.state.job_records[running].spec
    assert spec_of is not None
    for ran in (100.0, 1000.0, 1800.0, 2000.0, 3700.0, 5000.0, 7300.0, 9000.0):
        asked_often = live.beyond_s(running, spec_of, ran)
        asked_once = history.replayed().estimates.beyond_s(running, spec_of, ran)
        assert asked_often == asked_once, ran
    assert live.beyond_s(running, spec_of, 9000.0) is None  # none of them ran that long


def test_a_gang_overruns_only_past_its_learned_runtime_not_its_users_estimate() -> None:
    """The team's users say an hour and their jobs run two: a new one-hour gang of theirs is
    not overrunning after 90 minutes, only once past the two hours the log taught."""
    history = History("1x8")
    for _ in range(3):
        done = history.submit(a_job().named("sweep").gpus(1).estimate(HOUR))[0]
        finish(history, done, 2 * HOUR)
    job_id = history.submit(a_job().named("new").gpus(1).estimate(HOUR))[0]
    history.run()
    job = history.state.job_records[job_id]
    started = job.held_since
    assert started is not None
    policy, estimates = history.policy, history.state.estimates

    assert not has_overrun(job, started + 1.5 * HOUR, policy, estimates)
    assert has_overrun(job, started + 1.5 * HOUR, policy)  # by the user's word alone
    assert has_overrun(job, started + 2.1 * HOUR, policy, estimates)


def test_a_long_run_cancelled_shortens_no_overrunning_gangs_prediction() -> None:
    """Found by the attack round (2026-11-23): a cancel at 160 minutes, past the prediction
    (100) but short of the longest runs (200, 300), was learned as a run; a gang that had run
    150 minutes was then said to run 50 more instead of 150 (the runs longer than 150 were
    160, 200, 300, not 200, 300), though the cancelled job would have run at least 160."""
    history = History("1x8")
    minute = 60.0
    run_jobs(history, [("train", s * minute) for s in (10, 20, 30, 100, 200, 300)])
    estimates = history.state.estimates
    before = estimates.beyond_s("probe", spec("train"), 150 * minute)
    cancel_after(history, history.submit(a_job().named("train").gpus(1))[0], 160 * minute)
    assert estimates.beyond_s("probe", spec("train"), 150 * minute) == before


def test_the_heads_plan_waits_for_a_gang_past_its_estimate_until_its_estimated_end() -> None:
    """The head's plan reckons a running gang's end inline (core/reservation.py): each plan
    of the head behind a gang past its learned runtime starts exactly when `estimated_end`
    says that gang ends then: from the runs that went as long, and past the longest of them
    the overrun grace after now."""
    history = History("1x8")
    run_jobs(history, [("train", HOUR), ("train", 2 * HOUR), ("train", 3 * HOUR)] * 2)
    running = history.submit(a_job().named("train").gpus(8).priority("best-effort"))[0]
    history.run()
    started = history.now - 1
    head = history.submit(a_job().named("eval").gpus(8).priority("research"))[0]
    policy, estimates = history.policy, history.state.estimates
    planned: list[tuple[float, float]] = []
    for _ in range(10):
        decisions = history.cycle()
        plans = [e for e in decisions if isinstance(e, ReservationPlanned) and e.job_id == head]
        job = history.state.job_records[running]
        end = estimated_end(job, history.now, policy, estimates)
        for plan in plans:
            assert plan.start_at.timestamp() == pytest.approx(end, abs=1e-3), history.now
            planned.append((history.now - started, end - history.now))
        history.advance(HOUR / 2)
    assert history.job(running).state == "running"
    # Planned within its learned two hours, past them by the three-hour runs, past those by
    # the grace.
    assert [ran for ran, _ in planned if ran < 2 * HOUR]
    assert [ran for ran, later in planned if 2 * HOUR < ran < 3 * HOUR and later > 600]
    assert [ran for ran, later in planned if ran > 3 * HOUR and later == policy.overrun_grace_s]
