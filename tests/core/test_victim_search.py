"""How the planner searches for victims (DESIGN §3, preemption: the smallest set that
suffices, whole gangs only): a node whose victims free two units counts for both."""

from __future__ import annotations

from schemas.jobs import PreemptionRequested
from tests.core.builders import History, a_job


def victims(history: History) -> list[str]:
    return [p.job_id for p in history.events(PreemptionRequested)]


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
