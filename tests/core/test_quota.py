"""Hierarchical queues: guarantees are reachable, ceilings hold, idle capacity is borrowed."""

from __future__ import annotations

from schemas.jobs import PreemptionRequested
from tests.core.builders import History, a_job


def test_a_team_borrows_idle_capacity_beyond_its_guarantee_up_to_its_max() -> None:
    history = History("4x8:4:1")
    history.team("alpha", guaranteed=8, max_gpus=24)
    jobs = history.submit(*(a_job().gpus(8).team("alpha") for _ in range(4)))

    history.run()

    states = [history.job(j).state for j in jobs]
    assert states.count("running") == 3
    waiting = next(j for j in jobs if history.job(j).state == "queued")
    assert history.job(waiting).reason_code == "quota_ceiling"


def test_a_team_reclaims_its_guarantee_from_a_borrower() -> None:
    history = History("4x8:4:1")
    history.team("alpha", guaranteed=16).team("beta", guaranteed=16)
    borrowed = history.submit(*(a_job().gpus(8).team("beta") for _ in range(4)))
    history.run()
    assert history.state.allocated_gpus == 32
    owner = history.submit(a_job().gpus(8).team("alpha"))[0]

    history.run()

    victims = [p.job_id for p in history.events(PreemptionRequested)]
    assert len(victims) == 1 and victims[0] in borrowed
    for view in list(history.state.jobs()):
        if view.state == "preempting":
            history.exit(view.job_id, 0)
    history.run()
    assert history.job(owner).state == "running"


def test_a_team_beyond_its_guarantee_does_not_reclaim() -> None:
    history = History("2x8:2:1")
    history.team("alpha", guaranteed=8).team("beta", guaranteed=8)
    history.submit(a_job().gpus(8).team("alpha"), a_job().gpus(8).team("beta"))
    history.run()
    history.submit(a_job().gpus(8).team("alpha"))

    history.run(cycles=2)

    assert history.events(PreemptionRequested) == []


def test_a_parent_queue_ceiling_caps_its_children_together() -> None:
    history = History("4x8:4:1")
    history.queue("org", max_gpus=16)
    history.team("alpha", parent="org").team("beta", parent="org")
    a = history.submit(a_job().gpus(8).team("alpha"))[0]
    b = history.submit(a_job().gpus(8).team("beta"))[0]
    c = history.submit(a_job().gpus(8).team("beta"))[0]

    history.run()

    assert history.job(a).state == history.job(b).state == "running"
    assert history.job(c).reason_code == "quota_ceiling"
