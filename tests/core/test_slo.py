"""SLO classes (core/slo.py): inference-critical work starts at once on a full cluster from
the headroom the admin keeps; the victims checkpoint after, within their grace; preemption for
it never evicts a gang above the blast radius and takes the least lost work first."""

from __future__ import annotations

from core import SchedulingPolicy
from schemas.jobs import GangReserved, PreemptionRequested
from tests.core.builders import History, a_job

HEADROOM = SchedulingPolicy(inference_headroom_gpus=4, inference_max_victim_gpus=4)


def reserved_after_s(history: History, job_id: str) -> float:
    """Seconds from the job's submission to its gang's binding, in the log's (simulated) time."""
    times = {type(event).__name__: at for event, at in history.log
             if getattr(event, "job_id", None) == job_id
             and type(event).__name__ in ("JobSubmitted", "GangReserved")}  # fmt: skip
    return times["GangReserved"] - times["JobSubmitted"]


def full_of_training(history: History, gangs: int, gpus: int) -> list[str]:
    ids = history.submit(
        *[a_job().gpus(gpus).priority("research").estimate(86_400) for _ in range(gangs)]
    )
    history.run()
    return ids


def test_an_inference_burst_on_a_full_cluster_starts_within_a_second() -> None:
    history = History("4x8:2:2", HEADROOM)  # 32 GPUs
    training = full_of_training(history, 7, 4)  # 28 GPUs: the 4 left are the headroom
    assert all(history.job(job).state == "running" for job in training)
    late = history.submit(a_job().gpus(4).priority("research"))[0]
    history.run()
    assert history.job(late).state == "queued"
    assert history.deferrals(late)[-1].code == "inference_headroom"

    burst = history.submit(*[a_job().gpus(1).priority("inference-critical") for _ in range(4)])
    history.run()

    for job in burst:
        assert history.job(job).state == "running"
        assert reserved_after_s(history, job) <= 1.0
    # The headroom is short by 4: one training gang checkpoints and leaves after, in its grace.
    victims = history.events(PreemptionRequested)
    assert len(victims) == 1 and victims[0].preemptor_job_id is None
    assert history.job(victims[0].job_id).state == "preempting"
    assert victims[0].grace_s == HEADROOM.preemption_grace_s

    history.evict(victims[0].job_id)
    history.run(2)

    assert history.state.free_gpus == 4  # the headroom is back, and nobody else took it
    assert history.job(late).state == "queued"
    assert history.auditor.violations == []


def test_a_burst_larger_than_the_headroom_preempts_for_the_rest() -> None:
    history = History("4x8:2:2", HEADROOM)
    full_of_training(history, 7, 4)
    burst = history.submit(*[a_job().gpus(1).priority("inference-critical") for _ in range(6)])

    history.run()

    started = [job for job in burst if history.job(job).state == "running"]
    assert len(started) == 4
    assert history.events(PreemptionRequested)  # the other two wait for victims


def test_headroom_is_not_taken_from_gangs_within_their_guarantee() -> None:
    history = History("2x8:2:1", HEADROOM)
    history.team("train", guaranteed=16)
    history.submit(*[a_job().team("train").gpus(4).priority("research").estimate(86_400)
                     for _ in range(3)])  # fmt: skip
    history.run()
    history.submit(a_job().gpus(4).priority("inference-critical"))
    history.run()

    assert history.events(PreemptionRequested) == []


def test_inference_preemption_never_evicts_a_gang_above_the_blast_radius() -> None:
    history = History("2x8:2:1", SchedulingPolicy(inference_max_victim_gpus=8))
    big = history.submit(a_job().gpus(8).tasks(2).priority("research").estimate(86_400))[0]
    history.run()
    replica = history.submit(a_job().gpus(1).priority("inference-critical"))[0]

    history.run()

    assert history.job(big).state == "running"
    assert history.job(replica).state == "queued"
    assert history.events(PreemptionRequested) == []


def test_inference_preemption_takes_the_gang_with_the_least_lost_work() -> None:
    """Two 8-GPU gangs: the one that checkpoints every 10 minutes has lost at most that much;
    the other, which never checkpoints, would lose its whole run."""
    history = History("2x8:2:1", SchedulingPolicy(inference_max_victim_gpus=8))
    never = history.submit(a_job().gpus(8).priority("research").estimate(86_400))[0]
    history.run()
    history.advance(3600)
    checkpointed = a_job().gpus(8).priority("research").estimate(86_400).checkpoint_every(600)
    often = history.submit(checkpointed)[0]
    history.run()
    history.advance(7200)  # never: 3 h of work at stake; often: 2 h % 10 min = 0 lost
    history.submit(a_job().gpus(1).priority("inference-critical"))

    history.run()

    (victim,) = history.events(PreemptionRequested)
    assert victim.job_id == often
    assert history.job(never).state == "running"


def test_without_headroom_other_classes_use_every_gpu() -> None:
    history = History("2x8:2:1")
    training = full_of_training(history, 4, 4)

    assert all(history.job(job).state == "running" for job in training)
    assert history.state.free_gpus == 0


def test_the_first_gang_placed_in_the_headroom_is_by_the_inference_class_only() -> None:
    history = History("2x8:2:1", HEADROOM)
    production = history.submit(a_job().gpus(8).tasks(2).priority("production"))[0]
    history.run()

    assert history.job(production).state == "queued"
    assert history.deferrals(production)[-1].code == "inference_headroom"
    assert history.events(GangReserved, production) == []


def test_a_job_within_its_guarantee_may_take_the_headroom_which_borrowers_then_refill() -> None:
    history = History("2x8:2:1", HEADROOM)
    history.team("owner", guaranteed=8)
    borrowed = full_of_training(history, 3, 4)  # 12 GPUs of a queue without guarantee
    owned = history.submit(a_job().team("owner").gpus(4).priority("research"))[0]

    history.run()

    assert history.job(owned).state == "running"
    (victim,) = history.events(PreemptionRequested)
    assert victim.job_id in borrowed
