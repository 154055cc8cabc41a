"""Order: class, then fair share with decayed usage, then age; aging bounds every wait."""

from __future__ import annotations

from core import SchedulingPolicy
from schemas.jobs import GangReserved
from tests.core.builders import History, a_job


def test_a_higher_class_is_placed_before_an_older_lower_class() -> None:
    history = History("1x8:1:1")
    history.submit(a_job().gpus(8))
    history.run()
    older = history.submit(a_job().gpus(8).priority("research"))[0]
    newer = history.submit(a_job().gpus(8).priority("production").preemptible(False))[0]
    first = next(v.job_id for v in history.state.jobs() if v.state == "running")
    history.exit(first, 0)

    history.run()

    assert history.job(newer).state == "running"
    assert history.job(older).state == "queued"


def test_the_team_with_less_recent_usage_goes_first_within_a_class() -> None:
    history = History("2x8:2:1")
    history.team("heavy", guaranteed=8).team("light", guaranteed=8)
    hog = history.submit(a_job().gpus(8).tasks(2).team("heavy"))[0]
    history.run()
    history.advance(24 * 3600)
    heavy = history.submit(a_job().gpus(8).team("heavy"))[0]
    light = history.submit(a_job().gpus(8).team("light"))[0]
    history.exit(hog, 0)
    history.submit(a_job().gpus(8).team("heavy").priority("research"))  # keeps one node busy
    history.run()

    placed = [g.job_id for g in history.events(GangReserved)][1:]

    assert placed.index(light) < placed.index(heavy)


def test_aging_makes_a_long_waiting_job_the_head_with_a_reservation() -> None:
    policy = SchedulingPolicy(aging_max_wait_s=600)
    history = History("2x8:2:1", policy=policy)
    history.submit(a_job().gpus(8).priority("production").estimate(300))
    history.run()
    patient = history.submit(a_job().gpus(8).tasks(2).priority("research"))[0]
    # A steady stream of production work that would always win on class alone.
    for _ in range(20):
        history.submit(a_job().gpus(8).priority("production").estimate(300))
        for view in list(history.state.jobs()):
            if (
                view.state == "running"
                and view.job_id != patient
                and history.now - (view.started_at or history.now) >= 300
            ):
                history.exit(view.job_id, 0)
        history.run(every_s=60)
        if history.job(patient).state == "running":
            break

    assert history.job(patient).state == "running"
    assert history.job(patient).submitted_at is not None


def test_a_cycle_with_nothing_new_is_answered_from_the_memo_at_the_same_moment_only() -> None:
    history = History("1x8:1:1")
    history.submit(a_job().gpus(8).estimate(3600), a_job().gpus(8))
    history.run(cycles=2)
    history.cycle()
    assert not history.cycles[-1].skipped and history.cycles[-1].decisions == []

    history.cycle()

    assert history.cycles[-1].skipped
    assert history.cycles[-1].decisions == []
    # A moment later the cycle runs again: fair share decays with the clock, so the order of
    # the queues may have turned though nothing was recorded.
    history.advance(1)
    history.cycle()
    assert not history.cycles[-1].skipped


def test_borrowers_of_teams_with_a_guarantee_take_lent_capacity_in_arrival_order() -> None:
    """Having borrowed idle GPUs costs no one (they are reclaimed when a guarantee needs them),
    so it earns no penalty: the team that borrowed much yesterday gets the lent node first when
    its job waited longest. (Within the guarantees, fair share still decides, above.)"""
    history = History("2x8:2:1")
    history.team("heavy", guaranteed=4).team("light", guaranteed=4).team("infra", guaranteed=8)
    hog = history.submit(a_job().gpus(8).tasks(2).team("heavy"))[0]  # borrows the cluster
    history.run()
    history.advance(24 * 3600)
    history.exit(hog, 0)
    history.run()
    for team in ("heavy", "light"):
        history.occupy("n0000", 4, a_job().preemptible(False).team(team))
    infra = history.occupy("n0001", 8, a_job().preemptible(False).team("infra"))
    heavy = history.submit(a_job().gpus(8).team("heavy"))[0]  # beyond its guarantee: borrows
    history.advance(60)
    light = history.submit(a_job().gpus(8).team("light"))[0]  # likewise, a minute later
    history.run()
    history.exit(infra, 0)

    history.run()

    assert history.job(heavy).state == "running"
    assert history.job(light).state == "queued"
    assert history.auditor.violations == []
