"""Hierarchical queues: guarantees are reachable, ceilings hold, idle capacity is borrowed."""

from __future__ import annotations

import pytest

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
            history.evict(view.job_id)
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


def test_a_reclaimer_whose_victim_was_backfilled_again_reclaims_anew() -> None:
    """The simulator's invariant-4 case (job 69816 of the Philly trace), on one node.

    The free GPU the reclaim counted on is taken while the victim checkpoints; the victim,
    requeued, backfills onto the GPU it gave up. The reclaimer must not keep waiting for that
    victim's new gang: once its hysteresis has passed it reclaims again.
    """
    history = History("1x8:1:1")
    history.team("alpha", guaranteed=2).team("beta")
    history.submit(*(a_job().gpus(1).team("beta") for _ in range(6)))
    history.run()
    history.advance(60)
    victim = history.submit(a_job().gpus(1).team("beta").estimate(60))[0]
    history.run()  # one GPU stays free
    owner = history.submit(a_job().gpus(2).team("alpha"))[0]
    history.run()
    assert [p.job_id for p in history.events(PreemptionRequested)] == [victim]
    history.submit(a_job().gpus(1).team("beta"))
    history.run()  # a borrower takes the free GPU while the victim checkpoints
    history.evict(victim)
    history.run(cycles=2)
    assert history.job(victim).state == "running"  # backfilled onto its own GPU
    assert history.job(owner).state == "queued"

    history.run(cycles=30, every_s=60)

    reclaims = [p for p in history.events(PreemptionRequested) if p.preemptor_job_id == owner]
    assert len(reclaims) > 1  # it reclaimed anew rather than wait on the victim's new gang
    assert (
        history.job(owner).reason_code == "awaiting_preemption"
        or history.job(owner).state == "running"
    )
    for view in list(history.state.jobs()):
        if view.state == "preempting":
            history.evict(view.job_id)
    history.run(cycles=2)
    assert history.job(owner).state == "running"
    assert history.auditor.violations == []


def test_a_team_reclaims_a_whole_node_from_small_borrowers_scattered_over_the_cluster() -> None:
    """The youngest borrowed jobs sit one per node: evicting them in that order frees no node.

    The planner weighs each node's victims together, so the reclaimer takes one node's worth
    of borrowers rather than giving up after trying the youngest ones across the cluster.
    """
    history = History("64x8:8:1")
    history.team("alpha", guaranteed=8).team("beta")
    old = history.submit(*(a_job().gpus(1).team("beta") for _ in range(512)))
    history.run()
    first_on_each_node = {history.gang(j).ranks[0].node_id: j for j in reversed(old)}
    for job_id in first_on_each_node.values():
        history.exit(job_id)
    young = history.submit(*(a_job().gpus(1).team("beta") for _ in range(64)))
    history.run()
    assert {history.gang(j).ranks[0].node_id for j in young} == set(first_on_each_node)
    owner = history.submit(a_job().gpus(8).team("alpha"))[0]

    history.run()

    victims = [p.job_id for p in history.events(PreemptionRequested)]
    assert len(victims) == 8
    assert len({history.gang(j).ranks[0].node_id for j in victims}) == 1
    for job_id in victims:
        history.evict(job_id)
    history.run()
    assert history.job(owner).state == "running"


@pytest.mark.xfail(
    strict=True,
    reason="known bug (found by the property tests, not fixed here): a parent's ceiling filled "
    "by one child's borrowing holds a sibling within its guarantee at that ceiling; the "
    "ceiling check comes before any reclaim, and preemption only makes room in GPUs",
)
def test_a_child_within_its_guarantee_reclaims_under_a_parent_ceiling_filled_by_a_sibling() -> None:
    history = History("8x8:4:2")  # 64 GPUs; the org may use 48
    history.queue("org", max_gpus=48)
    history.team("alpha", guaranteed=4, parent="org").team("gamma", parent="org")
    history.submit(*(a_job().gpus(8).tasks(3).team("gamma") for _ in range(2)))
    history.run()
    owner = history.submit(a_job().gpus(1).team("alpha"))[0]

    history.run(cycles=3, every_s=60)

    assert history.job(owner).reason_code != "quota_ceiling"
    assert history.auditor.violations == []
