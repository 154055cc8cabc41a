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

    The free GPU the reclaim counted on is lost while the victim checkpoints (it is held for
    the reclaim, so no borrower takes it; in the simulator a borrower did, before the hold);
    the victim, requeued, backfills onto the GPU it gave up. The reclaimer must not keep
    waiting for that victim's new gang: once its hysteresis has passed it reclaims again.
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
    history.break_gpu("n0000", 7)  # the free GPU, while the victim checkpoints
    history.run()
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


def test_no_borrower_takes_the_free_gpus_a_reclaim_counted_on_while_its_victim_leaves() -> None:
    """The dev profile's invariant-4 report, made small. Gamma (guaranteed 4) reclaims the one
    4-GPU node: 2 GPUs are free, beta's borrowed 2-GPU gang is the victim. While the victim
    checkpoints, the preemptor is no head and holds no reservation; the free GPUs its plan
    counted on are held for it, so beta's next 2-GPU job waits and the preemptor lands as soon
    as the victim leaves (it used to land there, and the preemptor reclaimed again and again)."""
    history = History("1x4:1:1")
    history.team("gamma", guaranteed=4).team("beta")
    victim = history.submit(a_job().gpus(2).team("beta").estimate(86400))[0]
    history.run()
    owner = history.submit(a_job().gpus(4).team("gamma"))[0]
    waiting = history.submit(a_job().gpus(2).team("beta").estimate(86400))[0]
    history.run()
    assert [p.job_id for p in history.events(PreemptionRequested)] == [victim]

    history.run()  # the victim is still checkpointing

    assert history.job(waiting).state == "queued"
    history.evict(victim)
    history.run()
    assert history.job(owner).state == "running"


def test_a_second_reclaimer_evicts_nobody_while_the_gpus_held_for_the_first_are_idle() -> None:
    """GPUs held for a reclaim are idle GPUs: no gang is evicted while they could host the
    preemptor (DESIGN §3). Gamma reclaims 2 of beta's gangs and counts on the 2 free GPUs;
    alpha, behind it in line, would fit on those 2 free GPUs, so it evicts no one and waits
    for them, and reclaims from beta once gamma has landed."""
    history = History("1x8:1:1")
    history.team("gamma", guaranteed=4).team("alpha", guaranteed=2).team("beta")
    borrowed = history.submit(*(a_job().gpus(1).team("beta") for _ in range(6)))
    history.run()
    gamma = history.submit(a_job().gpus(4).team("gamma"))[0]
    history.run()
    victims = [p.job_id for p in history.events(PreemptionRequested)]
    assert len(victims) == 2 and set(victims) <= set(borrowed)
    alpha = history.submit(a_job().gpus(2).team("alpha"))[0]

    history.run(cycles=3)

    assert [p.job_id for p in history.events(PreemptionRequested)] == victims
    assert history.job(alpha).state == "queued"
    for victim in victims:
        history.evict(victim)
    history.run()
    assert history.job(gamma).state == "running"
    history.run(cycles=2)
    reclaims = [p for p in history.events(PreemptionRequested) if p.preemptor_job_id == alpha]
    assert len(reclaims) == 2
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


def test_a_child_within_its_guarantee_reclaims_under_a_parent_ceiling_filled_by_a_sibling() -> None:
    """Found by the property tests: the org's ceiling, filled by gamma's borrowing, held alpha
    (within its guarantee) for good. Alpha reclaims: one of gamma's gangs is evicted, exactly
    the one that makes the org's room, although idle GPUs would host alpha's job."""
    history = History("8x8:4:2")  # 64 GPUs; the org may use 48
    history.queue("org", max_gpus=48)
    history.team("alpha", guaranteed=4, parent="org").team("gamma", parent="org")
    borrowed = history.submit(*(a_job().gpus(8).tasks(3).team("gamma") for _ in range(2)))
    history.run()
    assert history.state.allocated_gpus == 48
    owner = history.submit(a_job().gpus(1).team("alpha"))[0]

    history.run(cycles=2)

    victims = [p.job_id for p in history.events(PreemptionRequested)]
    assert len(victims) == 1 and victims[0] in borrowed
    assert {p.preemptor_job_id for p in history.events(PreemptionRequested)} == {owner}
    assert history.job(owner).reason_code == "awaiting_preemption"
    history.evict(victims[0])
    history.run(cycles=2)
    assert history.job(owner).state == "running"
    # The evicted gang waits at the org's ceiling: 25 GPUs used, 24 more would make 49.
    assert history.job(victims[0]).reason_code == "quota_ceiling"
    assert history.state.allocated_gpus == 25
    assert history.auditor.violations == []


def test_a_child_within_its_guarantee_waits_at_the_parent_ceiling_until_borrowers_may_go() -> None:
    """The sibling's gangs are younger than their minimum runtime: the owner waits, saying
    so, and reclaims the moment one of them may be preempted."""
    history = History("8x8:4:2")
    history.queue("org", max_gpus=48)
    history.team("alpha", guaranteed=4, parent="org").team("gamma", parent="org")
    gamma = a_job().gpus(8).tasks(3).team("gamma").min_runtime(600)
    history.submit(gamma, a_job().gpus(8).tasks(3).team("gamma").min_runtime(900))
    history.run()
    owner = history.submit(a_job().gpus(1).team("alpha"))[0]

    history.run(cycles=5, every_s=100)

    assert history.events(PreemptionRequested) == []
    assert history.job(owner).reason_code == "quota_ceiling"
    assert history.job(owner).reason == (
        "needs 1 GPU; queue org would exceed its ceiling of 48 GPUs; "
        "queue alpha is within its guarantee and reclaims it"
    )

    history.run(cycles=2, every_s=100)  # 600 s after gamma's first gang started

    assert [p.job_id for p in history.events(PreemptionRequested)] == [gamma.job_id]
    assert history.auditor.violations == []


def test_a_reclaim_under_a_full_parent_ceiling_evicts_a_gang_under_that_ceiling() -> None:
    """The cluster and the org are both full. Beta's younger borrowed gang would free GPUs,
    but no room under the org's ceiling: one of gamma's gangs makes both, alone."""
    history = History("2x8:2:1")  # 16 GPUs; the org may use 12
    history.queue("org", max_gpus=12)
    history.team("alpha", guaranteed=4, parent="org").team("gamma", parent="org").team("beta")
    gamma = history.submit(*(a_job().gpus(4).team("gamma") for _ in range(3)))
    history.run()
    history.advance(60)
    history.submit(a_job().gpus(4).team("beta"))
    history.run()
    assert history.state.free_gpus == 0
    owner = history.submit(a_job().gpus(4).team("alpha"))[0]

    history.run()

    victims = [p.job_id for p in history.events(PreemptionRequested)]
    assert len(victims) == 1 and victims[0] in gamma
    history.evict(victims[0])
    history.run(cycles=2)
    assert history.job(owner).state == "running"
    assert history.auditor.violations == []


def test_a_reclaim_under_a_ceiling_takes_no_gang_more_than_the_room_needs() -> None:
    """The org is 5 GPUs over for the owner's 6, and no gang under it holds 5 alone. Taken in
    victim order (smallest first) three 1-GPU gangs and the 4-GPU one would go; two of them
    suffice: the 4-GPU gang and one 1-GPU gang."""
    history = History("4x8:2:2")  # 32 GPUs; the org may use 8
    history.queue("org", max_gpus=8)
    history.team("alpha", guaranteed=6, parent="org").team("gamma", parent="org")
    ones = history.submit(*(a_job().gpus(1).team("gamma") for _ in range(3)))
    four = history.submit(a_job().gpus(4).team("gamma"))[0]
    history.run()
    owner = history.submit(a_job().gpus(6).team("alpha"))[0]

    history.run()

    victims = sorted(p.job_id for p in history.events(PreemptionRequested))
    assert len(victims) == 2
    assert four in victims and len(set(victims) & set(ones)) == 1
    assert history.job(owner).reason_code == "preempting"
    assert history.auditor.violations == []


def test_a_reclaim_that_frees_gpus_outside_the_ceiling_also_makes_room_under_it() -> None:
    """Alpha (within its guarantee of 8) needs a whole node and 1 GPU of room under the org's
    ceiling of 8. Gamma's 1-GPU gang (under the org) sits beside a non-preemptible gang, so
    evicting it frees no node; beta's gang (outside the org) frees a node but no org quota:
    both go, and nothing else."""
    history = History("2x8:2:1")
    history.queue("org", guaranteed=8, max_gpus=8)
    history.team("alpha", guaranteed=8, parent="org").team("gamma", parent="org")
    history.team("ops", guaranteed=8).team("beta")
    history.occupy("n0000", 7, a_job().team("ops").priority("inference-critical"))
    under = history.occupy("n0000", 1, a_job().team("gamma").priority("research"))
    outside = history.occupy("n0001", 8, a_job().team("beta").priority("research"))
    owner = history.submit(a_job().gpus(8).team("alpha"))[0]

    history.run()

    assert sorted(p.job_id for p in history.events(PreemptionRequested)) == sorted([under, outside])
    assert history.job(owner).reason_code == "preempting"
    assert history.auditor.violations == []


def test_a_reclaim_takes_quota_room_under_its_ceiling_from_gpus_of_another_type() -> None:
    """Found by the property tests: the org's ceiling of 12 is 8 over, filled by gamma's gang on
    the A100 node. Alpha (within its guarantee of 8) needs 4 H100 GPUs: gamma's H100 gang makes
    the room but gives back only 4 of the 8 over the ceiling; gamma's A100 gang, no room for an
    H100 job, gives the rest. Both go; planned from the H100 pool alone, alpha waited for hours
    within its guarantee while borrowed GPUs could be reclaimed (invariant 4)."""
    history = History(
        "groups:\n- {count: 1, gpus: 8, gpu_type: H100}\n- {count: 1, gpus: 8, gpu_type: A100}\n"
    )
    history.queue("org", max_gpus=12)
    history.team("alpha", guaranteed=8, parent="org").team("gamma", parent="org")
    history.occupy("n0000", 4, a_job().team("alpha").gpu_type("H100"))
    room = history.occupy("n0000", 4, a_job().team("gamma").gpu_type("H100").preemptible(True))
    quota = history.occupy("n0001", 8, a_job().team("gamma").gpu_type("A100").preemptible(True))
    history.advance(600)
    owner = history.submit(a_job().gpus(4).team("alpha").gpu_type("H100"))[0]

    history.run()

    assert sorted(p.job_id for p in history.events(PreemptionRequested)) == sorted([room, quota])
    assert history.job(owner).reason_code == "preempting"
    assert history.auditor.violations == []


def test_quota_room_from_gpus_of_another_type_is_borrowed_capacity_first() -> None:
    """As above, with alpha's own best-effort gang on the A100 node beside gamma's borrowed
    one (alpha, guaranteed 12, holds 8): alpha's production job, which may evict lower
    classes of its own queue, takes gamma's borrowed A100 gang for the quota room, not its
    own."""
    history = History(
        "groups:\n- {count: 1, gpus: 8, gpu_type: H100}\n- {count: 1, gpus: 8, gpu_type: A100}\n"
    )
    history.queue("org", max_gpus=12)
    history.team("alpha", guaranteed=12, parent="org").team("gamma", parent="org")
    history.occupy("n0000", 4, a_job().team("alpha").gpu_type("H100"))
    room = history.occupy("n0000", 4, a_job().team("gamma").gpu_type("H100").preemptible(True))
    history.occupy("n0001", 4, a_job().team("alpha").priority("best-effort").preemptible(True))
    quota = history.occupy("n0001", 4, a_job().team("gamma").gpu_type("A100").preemptible(True))
    history.advance(600)
    history.submit(a_job().gpus(4).team("alpha").gpu_type("H100").priority("production"))

    history.run()

    assert sorted(p.job_id for p in history.events(PreemptionRequested)) == sorted([room, quota])
    assert history.auditor.violations == []
