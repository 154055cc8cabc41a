"""Short work first without knowing runtimes: attained-service (2D-LAS) order and preemption
for fairness (core/attained.py, core/fairness.py)."""

from __future__ import annotations

from core import SchedulingPolicy, schedule
from core.attained import attained_service, service_level
from core.fairness import lost_work_s
from schemas.jobs import GangReserved, JobRequeued, PreemptionRequested, TaskExited
from tests.core.builders import History, a_job

# One GPU-hour is level 1; fairness evictions on, the rest of the policy as it ships.
FAIR = SchedulingPolicy(fairness_preemption=True, las_thresholds_gpu_s=(3600.0, 36_000.0))


def _team(history: History) -> History:
    """One team held to the whole 8-GPU node (no borrowing): its own jobs compete."""
    return history.team("alpha", guaranteed=8, max_gpus=8)


def _long_running(history: History, seconds: float = 1200.0) -> str:
    long = history.submit(a_job().gpus(8).team("alpha"))[0]
    history.run()
    history.advance(seconds)
    return long


def test_service_levels_follow_the_thresholds() -> None:
    assert [service_level(s, FAIR) for s in (0.0, 3599.0, 3600.0, 36_000.0, 1e9)] == [
        0,
        0,
        1,
        2,
        2,
    ]


def test_a_short_job_overtakes_a_long_one_of_its_team_by_checkpoint_then_evict() -> None:
    history = _team(History("1x8:1:1", policy=FAIR))
    long = _long_running(history)  # 8 GPUs x 1,200 s: level 2
    short = history.submit(a_job().gpus(1).team("alpha"))[0]

    history.run()

    [request] = history.events(PreemptionRequested)
    assert (request.job_id, request.preemptor_job_id, request.code) == (long, short, "fairness")
    history.evict(long)
    history.run(cycles=2)
    assert history.job(short).state == "running"
    assert history.job(long).state == "queued"
    assert history.events(JobRequeued, long)[-1].code == "preempted"
    assert history.auditor.violations == []


def test_without_fairness_preemption_the_short_job_waits_for_the_long_one() -> None:
    history = _team(History("1x8:1:1", policy=SchedulingPolicy(fairness_preemption=False)))
    _long_running(history)
    short = history.submit(a_job().gpus(1).team("alpha"))[0]

    history.run(cycles=3, every_s=600)

    assert history.events(PreemptionRequested) == []
    assert history.job(short).state == "queued"


def test_the_evicted_long_job_is_not_starved_by_a_stream_of_short_ones() -> None:
    """Short jobs keep coming and each outranks it by attained service; aging puts it first
    after the policy's maximum wait, and it runs again."""
    policy = SchedulingPolicy(
        fairness_preemption=True, las_thresholds_gpu_s=(3600.0,), aging_max_wait_s=3600.0
    )
    history = _team(History("1x8:1:1", policy=policy))
    long = _long_running(history)
    history.submit(a_job().gpus(1).team("alpha"))
    history.run()
    history.evict(long)
    history.run()
    evicted_at = history.now
    assert history.job(long).state == "queued"

    restarted_at = None
    for _ in range(40):  # 40 x 300 s: well past the 1 h aging
        for view in list(history.state.jobs()):
            if view.state == "running" and view.job_id != long:
                history.exit(view.job_id, 0)
        history.submit(*(a_job().gpus(1).estimate(300).team("alpha") for _ in range(2)))
        history.run(cycles=2)
        if history.job(long).state == "running":
            restarted_at = history.now
            break
        history.advance(300)

    assert restarted_at is not None, "the long job starved"
    assert restarted_at - evicted_at <= policy.aging_max_wait_s + 2 * 300
    assert history.auditor.violations == []


def test_a_waiting_job_with_less_service_goes_before_an_older_one_with_more() -> None:
    history = _team(History("1x8:1:1", policy=SchedulingPolicy()))
    served = _long_running(history)  # level 2 once requeued
    history.record(JobRequeued(job_id=served, attempt=1, code="preempted", reason="test"))
    history.stop_released(history.events(JobRequeued, served))
    fresh = history.submit(a_job().gpus(8).team("alpha"))[0]

    history.run()

    assert history.job(fresh).state == "running"
    assert history.job(served).state == "queued"


def test_a_gang_that_has_not_run_long_enough_to_repay_the_checkpoint_is_left_alone() -> None:
    """8 GPUs x (60 s write) x 2 against 1 GPU x its run: worth it only after 960 s."""
    history = _team(History("1x8:1:1", policy=FAIR))
    long = _long_running(history, seconds=700.0)  # past the 600 s minimum, level 1
    history.submit(a_job().gpus(1).team("alpha"))

    started = history.state.job_records[long].started_at
    assert started is not None

    history.run()
    history.advance(started + 959 - history.now)
    history.run()
    assert history.events(PreemptionRequested) == []

    history.advance(started + 960 - history.now)
    history.run()
    assert [p.job_id for p in history.events(PreemptionRequested)] == [long]


def test_a_gang_of_the_same_level_is_not_evicted() -> None:
    """Hysteresis between levels: a job evicts only gangs a whole level above it."""
    history = _team(History("1x8:1:1", policy=FAIR))
    first = history.submit(a_job().gpus(4).team("alpha"))[0]
    history.submit(a_job().gpus(4).team("alpha"))
    history.run()
    history.advance(700)  # 4 GPUs x 700 s: level 0 still (2,800 GPU-s)
    history.exit(first, 0)
    history.submit(a_job().gpus(8).team("alpha"))

    history.run(cycles=2)

    assert history.events(PreemptionRequested) == []


def test_a_large_gang_never_pays_for_a_small_job() -> None:
    history = History("2x8:2:1", policy=FAIR).team("alpha", guaranteed=16, max_gpus=16)
    big = history.submit(a_job().gpus(8).tasks(2).team("alpha"))[0]
    history.run()
    history.advance(3600)
    history.submit(a_job().gpus(1).team("alpha"))

    history.run(cycles=2)

    assert history.events(PreemptionRequested) == []
    assert history.job(big).state == "running"


def test_another_teams_gang_is_never_evicted_for_fairness() -> None:
    history = History("1x8:1:1", policy=FAIR)
    history.team("alpha", guaranteed=4, max_gpus=4).team("beta", guaranteed=4, max_gpus=4)
    history.submit(a_job().gpus(4).team("beta"))
    history.submit(a_job().gpus(4).team("alpha"))
    history.run()
    history.advance(7200)
    history.submit(a_job().gpus(1).team("beta"))

    history.run()

    [request] = history.events(PreemptionRequested)
    assert history.job(request.job_id).queue == "beta"


def test_attained_service_survives_a_scheduler_restart_by_replay() -> None:
    history = _team(History("1x8:1:1", policy=FAIR))
    long = _long_running(history)
    short = history.submit(a_job().gpus(1).team("alpha"))[0]
    history.run()
    history.evict(long)
    history.run(cycles=2)
    live = history.state.job_records[long]
    started = next(at for event, at in history.log if isinstance(event, GangReserved))
    requeued = next(at for event, at in history.log if isinstance(event, JobRequeued))
    assert live.attained_gpu_s == 8 * (requeued - started) > 8 * 1200

    replayed = history.replayed()
    twice = history.replayed()
    for event, at in history.log:  # a redelivered release or exit changes nothing
        if isinstance(event, JobRequeued | TaskExited):
            twice.apply(event, at + 5.0)

    assert replayed.job_records[long].attained_gpu_s == live.attained_gpu_s
    assert twice.job_records[long].attained_gpu_s == live.attained_gpu_s
    assert attained_service(replayed.job_records[short], history.now) == attained_service(
        live_short := history.state.job_records[short], history.now
    )
    assert live_short.started_at is not None
    assert (
        schedule(replayed, history.now + 60).decisions
        == schedule(history.state, history.now + 60).decisions
    )


def test_work_lost_since_the_last_checkpoint_counts_against_an_eviction() -> None:
    """A checkpoint slower than the grace loses the work since the last periodic one: a gang
    with none would lose its whole run, which a 1-GPU job's wait never repays."""
    policy = SchedulingPolicy(
        fairness_preemption=True,
        las_thresholds_gpu_s=(3600.0,),
        checkpoint_write_estimate_s=300.0,  # over the 120 s grace
    )
    history = _team(History("1x8:1:1", policy=policy))
    long = _long_running(history, seconds=7200.0)
    history.submit(a_job().gpus(1).team("alpha"))

    history.run(cycles=3, every_s=600)

    assert history.events(PreemptionRequested) == []
    assert history.job(long).state == "running"
    spec = history.state.job_records[long].spec
    assert spec is not None and spec.checkpoint.interval_s is None
    assert lost_work_s(history.state.job_records[long], 1900.0, 300.0, 120.0) == 1900.0
    assert lost_work_s(history.state.job_records[long], 1900.0, 60.0, 120.0) == 0.0


# Predicted-short first (core/ordering.py:length_level): no fairness evictions here, so only the
# order of the waiting jobs decides who takes the node when the running gang ends.
NO_EVICTION = SchedulingPolicy(fairness_preemption=False)


def _node_busy_then_two_waiting(policy: SchedulingPolicy) -> tuple[History, str, str]:
    """Team alpha's node is full; a long job, then a short one, wait for all of it."""
    history = _team(History("1x8:1:1", policy=policy))
    running = history.submit(a_job().gpus(8).team("alpha").estimate(600))[0]
    history.run()
    history.advance(60)
    long = history.submit(a_job().gpus(8).team("alpha").estimate(8 * 3600))[0]
    history.advance(60)
    short = history.submit(a_job().gpus(8).team("alpha").estimate(300))[0]
    history.run()
    history.exit(running, 0)
    history.run(cycles=2)
    return history, long, short


def test_a_job_predicted_short_goes_before_an_older_one_predicted_long() -> None:
    history, long, short = _node_busy_then_two_waiting(NO_EVICTION)

    assert history.job(short).state == "running"
    assert history.job(long).state == "queued"
    assert history.auditor.violations == []


def test_without_predicted_lengths_the_older_job_goes_first() -> None:
    policy = SchedulingPolicy(fairness_preemption=False, predicted_length_thresholds_s=())
    history, long, short = _node_busy_then_two_waiting(policy)

    assert history.job(long).state == "running"
    assert history.job(short).state == "queued"


def test_predictions_of_one_length_level_keep_arrival_order() -> None:
    history = _team(History("1x8:1:1", policy=NO_EVICTION))
    running = history.submit(a_job().gpus(8).team("alpha").estimate(600))[0]
    history.run()
    first = history.submit(a_job().gpus(8).team("alpha").estimate(3000))[0]
    history.advance(60)
    history.submit(a_job().gpus(8).team("alpha").estimate(1000))  # the same level: >= 900 s
    history.run()
    history.exit(running, 0)
    history.run(cycles=2)

    assert history.job(first).state == "running"


def test_a_job_predicted_long_is_not_starved_by_predicted_short_ones() -> None:
    """Short jobs keep coming, each predicted shorter; aging puts the long one first."""
    policy = SchedulingPolicy(fairness_preemption=False, aging_max_wait_s=3600.0)
    history = _team(History("1x8:1:1", policy=policy))
    history.submit(a_job().gpus(8).team("alpha").estimate(300))
    history.run()
    long = history.submit(a_job().gpus(8).team("alpha").estimate(8 * 3600))[0]
    submitted_at = history.now
    started_at = None
    for _ in range(40):  # 40 x 300 s: well past the 1 h aging
        history.submit(a_job().gpus(8).team("alpha").estimate(300))
        for view in list(history.state.jobs()):
            if view.state == "running":
                history.exit(view.job_id, 0)
        history.run(cycles=2)
        if history.job(long).state == "running":
            started_at = history.now
            break
        history.advance(300)

    assert started_at is not None, "the job predicted long starved"
    assert started_at - submitted_at <= policy.aging_max_wait_s + 2 * 300
    assert history.auditor.violations == []


def test_a_borrowing_job_keeps_arrival_order_whatever_its_prediction() -> None:
    """Predicted-short first works within a team's guarantee; lent capacity goes in order."""
    history = History("1x8:1:1", policy=NO_EVICTION).team("alpha", guaranteed=0, max_gpus=8)
    running = history.submit(a_job().gpus(8).team("alpha").estimate(600))[0]
    history.run()
    history.advance(60)
    long = history.submit(a_job().gpus(8).team("alpha").estimate(8 * 3600))[0]
    history.advance(60)
    history.submit(a_job().gpus(8).team("alpha").estimate(300))
    history.run()
    history.exit(running, 0)
    history.run(cycles=2)

    assert history.job(long).state == "running"
