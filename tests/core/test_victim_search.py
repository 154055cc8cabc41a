"""How the planner searches for victims (DESIGN §3, preemption: the smallest set that
suffices, whole gangs only): a set of victims that frees exactly what the preemptor needs is
a fit; node by node, each node counts the whole units its victims add (two for an 8-GPU
gang freeing units of 4, one for a gang beside GPUs already free, none for a gang that frees
no unit, whose eviction is spared); victims chosen node by node that the preemptor does not
land on are spared; a gang that frees no whole GPU (a slice or a share) is passed over, not
the end of the search."""

from __future__ import annotations

from schemas.jobs import PreemptionRequested
from tests.core.builders import History, a_job
from tests.core.test_live_sharing import a_share, one_h100


def victims(history: History) -> list[str]:
    return [p.job_id for p in history.events(PreemptionRequested)]


def test_victims_that_free_exactly_the_gpus_and_cpus_needed_make_a_fit() -> None:
    # One node of 8 GPUs and 32 CPUs: 4 GPUs held by a gang that may not be preempted; two
    # 2-GPU best-effort gangs (one holding 16 CPUs) and a CPU-only research gang of 16 CPUs.
    # The preemptor needs 4 GPUs and all 32 CPUs: only all three victims together free them,
    # and then exactly 4 GPUs are free. No single gang suffices, nor the GPUs of the node's
    # cheapest victims alone (they leave the CPUs short).
    history = History("rack_size: 1\ngroups:\n  - {count: 1, gpus: 8, cpus: 32}\n")
    history.occupy("n0000", 4)
    cpu_holder = history.submit(a_job().gpus(2).cpus(16).priority("best-effort"))[0]
    history.run()
    history.advance(60)
    gpu_only = history.submit(a_job().gpus(2).priority("best-effort"))[0]
    prep = history.submit(a_job().cpu_only(16).priority("research"))[0]
    history.run()

    preemptor = history.submit(a_job().gpus(4).cpus(32).priority("production"))[0]
    history.cycle()

    assert sorted(victims(history)) == sorted([cpu_holder, gpu_only, prep])
    assert history.job(preemptor).reason_code == "preempting"


def test_victims_chosen_node_by_node_that_the_preemptor_does_not_land_on_are_spared() -> None:
    # A gang of three 4-GPU tasks. n0000 runs one 8-GPU research gang (two units once gone),
    # n0001 and n0002 two 4-GPU research gangs each (one unit per gang). No single gang
    # suffices. Node by node, the cheapest nodes to clear a unit on are n0001 and n0002 (4
    # GPUs each), then n0000 (8 GPUs); the preemptor lands on n0000 and one of the others,
    # so the 4-GPU gang on the third node stays: 12 GPUs evicted, not 16.
    history = History("3x8:3:1")
    wide = history.occupy("n0000", 8, a_job().priority("research"))
    history.advance(60)
    pairs = [
        [history.occupy(node, 4, a_job().priority("research")) for _ in range(2)]
        for node in ("n0001", "n0002")
    ]

    history.submit(a_job().gpus(4).tasks(3).priority("production"))
    history.cycle()

    evicted = victims(history)
    assert wide in evicted
    assert len(evicted) == 2
    assert sum(history.bound_gpus(job) for job in evicted) == 12
    assert sum(job in evicted for pair in pairs for job in pair) == 1


def test_a_node_whose_victim_frees_two_units_counts_for_both() -> None:
    # A gang of three 4-GPU tasks. n0000 runs one 8-GPU research gang (two units once gone),
    # n0001 two 4-GPU research gangs, n0002 a gang that may not be preempted. The 8-GPU gang
    # and one 4-GPU gang free the three units: 12 GPUs evicted, not all three gangs' 16.
    history = History("3x8:3:1")
    wide = history.occupy("n0000", 8, a_job().priority("research"))
    history.advance(60)
    pair = [history.occupy("n0001", 4, a_job().priority("research")) for _ in range(2)]
    history.occupy("n0002", 8)

    preemptor = history.submit(a_job().gpus(4).tasks(3).priority("production"))[0]
    history.cycle()

    evicted = victims(history)
    assert len(evicted) == 2 and wide in evicted and len(set(evicted) & set(pair)) == 1
    assert history.job(preemptor).reason_code == "preempting"
    for job in evicted:
        history.evict(job)
    history.run()
    assert history.job(preemptor).state == "running"
    assert history.auditor.violations == []


def test_a_gang_whose_eviction_frees_no_unit_on_its_node_is_spared() -> None:
    # A gang of three 4-GPU tasks. n0000 has 4 GPUs free (one unit) and a 2-GPU research
    # gang beside a gang that may not be preempted: evicting it frees no further unit.
    # n0001 and n0002 each free a unit by evicting a 4-GPU research gang. The preemptor lands
    # on all three nodes; the 2-GPU gang on n0000 stays.
    history = History("3x8:3:1")
    history.occupy("n0000", 2)
    small = history.occupy("n0000", 2, a_job().priority("research"))
    fours = []
    for node in ("n0001", "n0002"):
        history.occupy(node, 4)
        fours.append(history.occupy(node, 4, a_job().priority("research")))

    history.submit(a_job().gpus(4).tasks(3).priority("production"))
    history.cycle()

    assert sorted(victims(history)) == sorted(fours)
    assert history.job(small).state == "running"


def test_a_node_with_a_free_unit_counts_only_the_units_its_victims_add() -> None:
    # A gang of four 4-GPU tasks. n0000 and n0001 each have a unit free and a 4-GPU research
    # gang that frees one more; n0002 has two young 2-GPU research gangs beside a gang that
    # may not be preempted (first in victim order: the smallest). The two 4-GPU gangs free
    # the two units missing: two gangs go, not the two small ones and a 4-GPU gang.
    history = History("3x8:3:1")
    olds = [history.occupy(node, 4, a_job().priority("research")) for node in ("n0000", "n0001")]
    history.advance(60)
    history.occupy("n0002", 4)
    smalls = [history.occupy("n0002", 2, a_job().priority("research")) for _ in range(2)]

    history.submit(a_job().gpus(4).tasks(4).priority("production"))
    history.cycle()

    assert sorted(victims(history)) == sorted(olds)
    assert all(history.job(job).state == "running" for job in smalls)


def test_a_node_whose_victims_free_a_unit_and_a_half_counts_for_one_unit() -> None:
    # A gang of three 4-GPU tasks. n0000 and n0001 each have 2 GPUs free and a 4-GPU research
    # gang: evicting it frees one unit (6 GPUs, not a unit and a half); n0002 frees one by
    # its old 4-GPU research gang, n0003 by two young 2-GPU ones (the first in victim order).
    # Three 4-GPU gangs go: not the two small ones and two 4-GPU gangs.
    history = History("4x8:4:1")
    history.occupy("n0002", 4)
    oldest = history.occupy("n0002", 4, a_job().priority("research"))
    history.advance(60)
    halves = []
    for node in ("n0000", "n0001"):
        history.occupy(node, 2)
        halves.append(history.occupy(node, 4, a_job().priority("research")))
    history.advance(60)
    history.occupy("n0003", 4)
    smalls = [history.occupy("n0003", 2, a_job().priority("research")) for _ in range(2)]

    history.submit(a_job().gpus(4).tasks(3).priority("production"))
    history.cycle()

    assert sorted(victims(history)) == sorted([*halves, oldest])
    assert all(history.job(job).state == "running" for job in smalls)


def test_a_share_first_in_victim_order_is_passed_over_for_a_whole_gpu() -> None:
    # Two GPUs: a research share of half of one (the smallest gang, so first in victim order)
    # and a 1-GPU research gang on the other. Evicting the share frees no whole GPU; the
    # production gang of one GPU evicts the 1-GPU gang.
    history = History(cluster=one_h100(mig="none", gpus=2))
    share = history.submit(a_share(0.5).priority("research"))[0]
    history.run()
    whole = history.submit(a_job().gpus(1).priority("research"))[0]
    history.run()
    assert history.job(share).state == "running" and history.job(whole).state == "running"

    history.submit(a_job().gpus(1).priority("production"))
    history.cycle()

    assert victims(history) == [whole]
    assert history.job(share).state == "running"
