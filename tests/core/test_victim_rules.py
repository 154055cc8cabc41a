"""Who is evicted, and when (DESIGN §3, preemption): borrowers first, then the lowest class,
then the smallest set that suffices, the smallest and youngest gang first among equals; whole
gangs only; never younger than the minimum runtime, nor again within the hysteresis window;
and the scheduler wakes exactly when such a protection ends."""

from __future__ import annotations

from schemas.jobs import PreemptionRequested
from tests.core.builders import History, a_job


def victims(history: History) -> list[str]:
    return [p.job_id for p in history.events(PreemptionRequested)]


def test_the_lowest_class_goes_first_among_gangs_that_would_each_suffice() -> None:
    history = History("2x8:2:1")
    research = history.submit(a_job().gpus(8).priority("research"))[0]
    best_effort = history.submit(a_job().gpus(8).priority("best-effort"))[0]
    history.run()

    history.submit(a_job().gpus(8).priority("production"))
    history.run()

    assert victims(history) == [best_effort]
    assert history.job(research).state == "running"


def test_the_smallest_gang_that_suffices_goes_first() -> None:
    history = History("1x8:1:1")
    four = history.occupy("n0000", 4, a_job().priority("research"))
    two = history.occupy("n0000", 2, a_job().priority("research"))
    history.occupy("n0000", 2, a_job().priority("production"))

    history.submit(a_job().gpus(2).priority("production"))
    history.run()

    assert victims(history) == [two]
    assert history.job(four).state == "running"


def test_the_youngest_of_equal_gangs_goes_first() -> None:
    history = History("2x8:2:1")
    old = history.submit(a_job().gpus(8))[0]
    history.run()
    history.advance(600)
    young = history.submit(a_job().gpus(8))[0]
    history.run()
    history.advance(600)

    history.submit(a_job().gpus(8).priority("production"))
    history.run()

    assert victims(history) == [young]
    assert history.job(old).state == "running"


def test_a_gang_bound_but_not_yet_started_may_be_preempted() -> None:
    history = History("1x8:1:1")
    bound = history.submit(a_job().gpus(8))[0]
    history.run(agents=False)
    assert history.job(bound).state == "reserved"

    history.submit(a_job().gpus(8).priority("production"))
    history.run(agents=False)

    assert victims(history) == [bound]


def test_a_gang_may_be_preempted_the_moment_its_minimum_runtime_is_over() -> None:
    history = History("1x8:1:1")
    young = history.submit(a_job().gpus(8).min_runtime(900))[0]
    history.run(every_s=0)
    started = history.now
    history.advance(300)
    history.submit(a_job().gpus(8).priority("production"))

    history.cycle()
    assert victims(history) == []
    assert history.cycles[-1].next_wakeup == started + 900  # it wakes when that protection ends

    history.advance(600)  # exactly 900 s after the start
    history.cycle()
    assert victims(history) == [young]


def test_a_preempted_gang_may_be_preempted_again_the_moment_its_hysteresis_is_over() -> None:
    history = History("1x8:1:1")
    victim = history.submit(a_job().gpus(8).priority("best-effort"))[0]
    history.run(every_s=0)
    first = history.submit(a_job().gpus(8).priority("production").estimate(60))[0]
    history.cycle()
    preempted_at = history.now
    history.evict(victim)
    history.run(every_s=0)
    history.exit(first, 0)
    history.run(cycles=2, every_s=0)
    assert history.job(victim).state == "running"
    history.submit(a_job().gpus(8).priority("production"))

    history.cycle()
    assert victims(history) == [victim]
    assert history.cycles[-1].next_wakeup == preempted_at + 600

    history.advance(preempted_at + 600 - history.now)  # the policy's hysteresis_s
    history.cycle()
    assert victims(history) == [victim, victim]


def test_a_node_with_free_gpus_is_cleared_with_the_fewest_evicted_gpus() -> None:
    """No single gang suffices. Node n0000 runs eight 1-GPU gangs (the smallest, so first in
    victim order); n0001 has 4 GPUs free and two 2-GPU gangs; on n0002 a 1-GPU gang sits
    beside a gang of the preemptor's class, so evicting it frees no node. The free GPUs
    count: the two 2-GPU gangs clear n0001, where eight gangs would clear n0000."""
    history = History("3x8:3:1")
    for _ in range(8):
        history.occupy("n0000", 1, a_job().priority("research"))
    pair = [history.occupy("n0001", 2, a_job().priority("research")) for _ in range(2)]
    history.occupy("n0002", 7, a_job().priority("production"))
    history.occupy("n0002", 1, a_job().priority("research"))

    history.submit(a_job().gpus(8).priority("production"))
    history.run()

    assert sorted(victims(history)) == sorted(pair)


def test_a_gang_that_requires_one_rack_evicts_within_one_rack_only_what_it_lands_on() -> None:
    """Racks r000 (n0000, n0001) and r001 (n0002, n0003); n0001 runs a gang of the
    preemptor's class. The youngest victim is on n0000: taking victims in order, it would go
    with one on r001 before a rack fits; the preemptor lands on r001, so only the two there
    are evicted."""
    history = History("4x8:2:2")
    history.occupy("n0001", 8, a_job().priority("production"))
    on_r001 = [history.occupy(node, 8, a_job().priority("research")) for node in ("n0002", "n0003")]
    history.advance(600)
    youngest = history.occupy("n0000", 8, a_job().priority("research"))

    history.submit(a_job().gpus(8).tasks(2).require("rack").priority("production"))
    history.run()

    assert sorted(victims(history)) == sorted(on_r001)
    assert history.job(youngest).state == "running"


def test_one_gang_that_suffices_alone_goes_rather_than_smaller_ones_together() -> None:
    """The 2-GPU gang is first in victim order but too small alone; the 4-GPU gang after it
    suffices alone, so it goes alone."""
    history = History("1x8:1:1")
    history.occupy("n0000", 2, a_job().priority("research"))
    four = history.occupy("n0000", 4, a_job().priority("research"))
    history.occupy("n0000", 2, a_job().priority("production"))

    history.submit(a_job().gpus(4).priority("production"))
    history.run()

    assert victims(history) == [four]


def test_a_node_already_free_counts_towards_a_gang_of_several_nodes() -> None:
    """A gang of two whole nodes: n0002 is free, so one more node must be cleared, and the
    cheapest to clear is n0001 (4 GPUs free, two 2-GPU gangs). No single gang suffices; n0003
    is half free beside a gang of the preemptor's class; n0000's eight 1-GPU gangs (first in
    victim order) stay. Half-free nodes are no half units."""
    history = History("4x8:4:1")
    ones = [history.occupy("n0000", 1, a_job().priority("research")) for _ in range(8)]
    pair = [history.occupy("n0001", 2, a_job().priority("research")) for _ in range(2)]
    history.occupy("n0003", 4, a_job().priority("production"))

    history.submit(a_job().gpus(8).tasks(2).priority("production"))
    history.run()

    assert sorted(victims(history)) == sorted(pair)
    assert all(history.job(job).state == "running" for job in ones)


def test_a_typed_gang_counts_the_free_nodes_of_its_own_type_only() -> None:
    """As above, on the H100 pool of a mixed cluster (its free node is n0002); the free
    A100 GPUs are of no use to it, nor is evicting a gang from an A100 node."""
    history = History(
        "groups:\n"
        "- {count: 3, gpus: 8, gpu_type: H100, rack_size: 3, racks_per_block: 1}\n"
        "- {count: 2, gpus: 8, gpu_type: A100, rack_size: 2, racks_per_block: 1}\n"
    )
    ones = [history.occupy("n0000", 1, a_job().priority("research")) for _ in range(8)]
    pair = [history.occupy("n0001", 2, a_job().priority("research")) for _ in range(2)]
    history.advance(60)
    # The youngest and smallest gang, first in victim order, but on an A100 node.
    history.occupy("n0003", 1, a_job().priority("research"))

    history.submit(a_job().gpus(8).tasks(2).gpu_type("H100").priority("production"))
    history.run()

    assert sorted(victims(history)) == sorted(pair)
    assert all(history.job(job).state == "running" for job in ones)


def test_two_preemptors_in_one_cycle_never_take_the_same_gang() -> None:
    history = History("2x8:2:1")
    gangs = history.submit(*(a_job().gpus(8) for _ in range(2)))
    history.run()

    first, second = history.submit(*(a_job().gpus(8).priority("production") for _ in range(2)))
    history.run()

    preemptions = history.events(PreemptionRequested)
    assert sorted(p.job_id for p in preemptions) == sorted(gangs)
    assert sorted(str(p.preemptor_job_id) for p in preemptions) == sorted([first, second])


def test_a_preemptor_beyond_its_guarantee_takes_no_borrower_of_its_own_class() -> None:
    """Borrowers go first, but only among gangs the preemptor may take at all: beta borrows
    with a production gang; alpha's production job is beyond its guarantee (it has none), so
    it may take lower classes only, and there are none."""
    history = History("1x8:1:1")
    history.team("alpha").team("beta")
    history.submit(a_job().gpus(8).team("beta").priority("production"))
    history.run()

    history.submit(a_job().gpus(8).team("alpha").priority("production"))
    history.run(cycles=3)

    assert victims(history) == []


def test_a_gang_its_guarantee_protects_is_passed_over_not_the_end_of_the_search() -> None:
    """First in victim order is beta's best-effort gang, within beta's guarantee: another team
    may not take it. The preemptor's own team's research gang after it may go."""
    history = History("1x8:1:1")
    history.team("alpha").team("beta", guaranteed=4)
    protected = history.occupy("n0000", 4, a_job().team("beta").priority("best-effort"))
    own = history.occupy("n0000", 4, a_job().team("alpha").priority("research"))

    history.submit(a_job().gpus(4).team("alpha").priority("production"))
    history.run()

    assert victims(history) == [own]
    assert history.job(protected).state == "running"


def test_an_overdue_head_that_cannot_preempt_by_class_evicts_nothing_run_past_its_estimate() -> (
    None
):
    """A research job cannot preempt by class; as the head whose reservation is overdue it
    still may not evict the best-effort gang that ran past its estimate (without one, the
    policy's default of 4 hours): an estimate is a hint, never a limit."""
    history = History("1x8:1:1")
    late = history.submit(a_job().gpus(8).priority("best-effort"))[0]
    history.run()
    head = history.submit(a_job().gpus(8).priority("research"))[0]
    history.run()
    assert history.job(head).reason_code == "reserved_head"

    history.run(cycles=6, every_s=3600)

    assert victims(history) == []
    assert history.job(late).state == "running"
    assert history.job(head).reason_code == "reserved_head"


def test_when_borrowers_alone_cannot_make_room_a_borrower_still_goes_before_an_own_gang() -> None:
    # n0 holds a fixed 2-GPU gang, an older 2-GPU research gang borrowed by team beta, and two
    # younger 2-GPU research gangs of alpha's own. The production preemptor of alpha needs 4
    # GPUs on the node: beta's borrowed gang alone frees only 2, so one more gang must go,
    # and the borrower is still the first of the two (not both of alpha's younger gangs,
    # which the victim order of age alone would take).
    history = History("1x8:1:1")
    history.occupy("n0000", 2)
    borrowed = history.occupy("n0000", 2, a_job().team("beta").priority("research"))
    history.advance(600)
    own = [history.occupy("n0000", 2, a_job().priority("research")) for _ in range(2)]

    history.submit(a_job().gpus(4).priority("production"))
    history.cycle()

    assert victims(history) == [borrowed, own[0]]
    assert history.job(own[1]).state == "running"


def test_nodes_cleared_with_the_fewest_gpus_evicted_beat_the_victim_order() -> None:
    # A 2x8 gang needs two whole nodes. n0 and n1 each have 4 free GPUs and a 4-GPU research
    # gang; n2 is one 8-GPU best-effort gang, first in victim order (the lowest class). Node
    # by node, clearing n0 and n1 evicts 8 GPUs; taking victims in order would evict the
    # best-effort gang and one more (12 GPUs) and still land on two nodes.
    history = History("3x8:3:1")
    small = [history.occupy(node, 4, a_job().priority("research")) for node in ("n0000", "n0001")]
    history.occupy("n0002", 8, a_job().priority("best-effort"))

    history.submit(a_job().gpus(8).tasks(2).priority("inference-critical"))
    history.cycle()

    assert sorted(victims(history)) == sorted(small)


def test_a_typed_gang_clears_nodes_of_a_pool_with_no_free_gpu_at_all() -> None:
    # Every H100 GPU is busy with 4-GPU research gangs, none of which alone makes room for a
    # typed 2x8 gang: it clears both nodes, counting the free units of a pool that has none
    # (and that no plan of this cycle touched: the head is an A100 job, held by a gang that
    # cannot be preempted).
    history = History(
        "groups:\n- {count: 1, gpus: 8, gpu_type: A100}\n- {count: 2, gpus: 8, gpu_type: H100}\n"
    )
    history.occupy("n0000", 8)
    small = [
        history.occupy(node, 4, a_job().priority("research").gpu_type("H100"))
        for node in ("n0001", "n0001", "n0002", "n0002")
    ]
    head = history.submit(a_job().gpus(8).gpu_type("A100").priority("production"))[0]

    history.submit(a_job().gpus(8).tasks(2).gpu_type("H100").priority("production"))
    history.cycle()

    assert history.job(head).reason_code == "reserved_head"
    assert sorted(victims(history)) == sorted(small)


def test_at_most_eight_preemptors_evict_in_one_cycle_the_ninth_waits_for_the_next() -> None:
    # Sixteen 1-GPU research gangs fill the cluster; nine 1-GPU production jobs could each
    # take one. A cycle lets eight preemptors evict (MAX_PREEMPTORS_PER_CYCLE); the ninth
    # evicts in the next cycle.
    history = History("2x8:2:1")
    history.submit(*(a_job().gpus(1).priority("research") for _ in range(16)))
    history.run()
    history.submit(*(a_job().gpus(1).priority("production") for _ in range(9)))

    history.cycle()
    assert len({p.preemptor_job_id for p in history.events(PreemptionRequested)}) == 8

    history.cycle()
    assert len({p.preemptor_job_id for p in history.events(PreemptionRequested)}) == 9


def test_the_preemptor_says_whom_it_preempts_and_each_victim_says_why() -> None:
    # Eight 1-GPU research gangs fill the node; an 8-GPU production job evicts all eight. Its
    # reason names the first three and counts the rest; each victim is told by whom and why.
    history = History("1x8:1:1")
    gangs = history.submit(*(a_job().gpus(1).priority("research") for _ in range(8)))
    history.run()
    preemptor = history.submit(a_job().gpus(8).priority("production"))[0]

    history.cycle()

    first = ", ".join(victims(history)[:3])
    assert sorted(victims(history)) == sorted(gangs)
    assert history.job(preemptor).reason == (
        f"needs 8 GPUs in one NVLink domain; preempting {first} and 5 more; "
        "starts once they checkpoint (within 120 s)"
    )
    assert {p.reason for p in history.events(PreemptionRequested)} == {
        f"preempted for job {preemptor} (priority production)"
    }
    assert history.cycles[-1].preemptions == 8


def test_a_cpu_only_gang_is_passed_over_not_the_end_of_the_search_for_gpus() -> None:
    """A CPU-only gang holds no GPU, so it is first in victim order (the smallest); evicting
    it frees nothing a gang of GPUs alone could use. It stays, and the search goes on to the
    research gangs after it."""
    history = History("rack_size: 1\ngroups:\n  - {count: 1, gpus: 8, cpus: 32}\n")
    prep = history.submit(a_job().cpu_only(2).priority("research"))[0]
    research = history.submit(*(a_job().gpus(1).priority("research") for _ in range(8)))
    history.run()

    history.submit(a_job().gpus(1).priority("production"))
    history.run()

    assert len(victims(history)) == 1 and victims(history)[0] in research
    assert history.job(prep).state == "running"


def test_a_preemptor_of_exactly_three_names_them_all_and_each_victim_is_told_the_priority() -> None:
    history = History("1x4:1:1")
    history.submit(*(a_job().gpus(1).priority("research") for _ in range(4)))
    history.run()
    preemptor = history.submit(a_job().gpus(3).priority("production"))[0]

    history.cycle()

    assert len(victims(history)) == 3
    assert history.job(preemptor).reason == (
        f"needs 3 GPUs in one NVLink domain; preempting {', '.join(victims(history))}; "
        "starts once they checkpoint (within 120 s)"
    )
    assert {p.code for p in history.events(PreemptionRequested)} == {"priority"}


def test_a_team_reclaiming_its_guarantee_tells_each_victim_so_and_counts_the_fourth() -> None:
    history = History("1x4:1:1")
    history.team("alpha", guaranteed=4).team("beta")
    history.submit(*(a_job().gpus(1).team("beta") for _ in range(4)))
    history.run()
    owner = history.submit(a_job().gpus(4).team("alpha"))[0]

    history.cycle()

    first = ", ".join(victims(history)[:3])
    assert len(victims(history)) == 4
    assert history.job(owner).reason == (
        f"needs 4 GPUs in one NVLink domain; preempting {first} and 1 more; "
        "starts once they checkpoint (within 120 s)"
    )
    requests = history.events(PreemptionRequested)
    assert {p.code for p in requests} == {"reclaim"}
    assert {p.reason for p in requests} == {
        f"preempted for job {owner} (reclaiming guaranteed capacity)"
    }
