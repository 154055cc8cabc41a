"""The auditor's borrowers_first rule judges a preemption by the gangs the cycle could evict:
those bound before it. A gang bound earlier in the same cycle is no victim the core could have
taken instead (a cycle's preemption phase chooses among the gangs its state held when it began).

attack4's storm (positions 34455-34472): tc's 329761c03dc3, a preemptor whose victim had just
gone, was bound to the freed n0003; in the same cycle ta's c4891aa5fc5b, within its guarantee,
evicted ta's own best-effort gang with seven of tc's on n0010, and the auditor said evicting tc's
borrowers (329761c03dc3 among them) would have made room: 62 such reports, all of this kind.
"""

from __future__ import annotations

from schemas.jobs import GangReserved, PreemptionRequested
from tests.core.builders import History, a_job


def test_a_gang_bound_in_the_same_cycle_is_no_borrower_the_preemptor_could_have_taken() -> None:
    history = History("3x8:3:1")
    history.team("ta", guaranteed=12).team("tc", guaranteed=8)
    history.occupy("n0002", 8, a_job().team("tc").preemptible(False))
    mine = history.occupy("n0001", 4, a_job().team("ta").priority("best-effort"))
    borrowed = history.occupy("n0001", 4, a_job().team("tc").priority("best-effort"))
    gone = history.occupy("n0000", 8, a_job().team("tc").priority("best-effort"))
    first = history.submit(a_job().team("tc").priority("production").gpus(8))[0]
    history.advance(1.0)
    history.cycle()
    assert [e.job_id for e in history.events(PreemptionRequested)] == [gone]

    # The victim stops; ta's job, within its guarantee, arrives before the next cycle.
    history.advance(1.0)
    history.evict(gone)
    urgent = history.submit(a_job().team("ta").priority("production").gpus(8))[0]
    decisions = history.cycle()

    # The preemptor whose victim is gone goes first, onto the node it paid for; ta's job then
    # takes n0001 back: tc's borrower and ta's own gang (tc's other gang may not be evicted).
    bound = [e for e in decisions if isinstance(e, GangReserved)]
    assert [(e.job_id, e.ranks[0].node_id) for e in bound] == [(first, "n0000")]
    evicted = {
        e.job_id
        for e in decisions
        if isinstance(e, PreemptionRequested) and e.preemptor_job_id == urgent
    }
    assert evicted == {mine, borrowed}
    assert history.auditor.violations == []
