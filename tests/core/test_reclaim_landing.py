"""A job within its guarantee that waits for capacity reclaims borrowed GPUs in the preemption
phase, which comes after placing (core/cycle.py). The free GPUs its reclaim will land on are
held from the jobs behind it in line while they are placed (core/backfill.py `place`), as
those of a preemptor awaiting its victims are: a borrower backfilled onto them in that very
cycle was the reclaim's next victim one cycle (~20 ms) later, started and evicted for a
reason the scheduler already knew, and the reclaim itself waited that cycle for it.

Seen end to end: a borrower's short gang was backfilled beside the reclaiming head (it ends
before the head's reservation starts), and the next cycle evicted it with the gang the
reservation waited for.
"""

from __future__ import annotations

from schemas.jobs import GangReserved, PreemptionRequested
from tests.core.builders import History, a_job


def _evicted_by(history: History, preemptor: str) -> set[str]:
    return {
        e.job_id
        for e in history.events(PreemptionRequested)
        if str(e.preemptor_job_id) == preemptor
    }


def _bound(history: History) -> list[str]:
    return [e.job_id for e in history.events(GangReserved)]


def _lent_half_node() -> tuple[History, str, str]:
    """One node: a lender's gang borrows half of it for a day; the owner's whole-node job,
    within the owner's guarantee, waits for it (the head, its reservation at the gang's end)."""
    history = History("1x8:1:1")
    history.team("owner", guaranteed=8).team("lender")
    borrowed = history.occupy("n0000", 4, a_job().team("lender").estimate(86400))
    history.advance(10)
    owner = history.submit(a_job().team("owner").gpus(8))[0]
    history.advance(1)
    return history, borrowed, owner


def test_a_borrower_is_not_backfilled_onto_the_gpus_a_waiting_reclaim_lands_on() -> None:
    history, borrowed, owner = _lent_half_node()
    # Short: it would end before the reservation starts, so backfill alone lets it in.
    short = history.submit(a_job().team("lender").gpus(4).estimate(600))[0]

    history.run(every_s=0.02)

    # The reclaim is decided in the first cycle and takes only the gang that borrowed first.
    assert _evicted_by(history, owner) == {borrowed}
    assert short not in _bound(history)
    history.run(every_s=0.02)
    assert _evicted_by(history, owner) == {borrowed}  # the next cycle evicts no one more
    assert history.job(short).state == "queued"

    history.evict(borrowed)
    history.run()
    assert history.job(owner).state == "running"
    assert history.job(short).state == "queued"
    assert history.auditor.violations == []


def test_a_borrower_still_takes_idle_gpus_the_reclaim_does_not_land_on() -> None:
    history = History("2x8:2:1")
    history.team("owner", guaranteed=8).team("lender").team("infra")
    history.occupy("n0001", 6, a_job().team("infra").preemptible(False))
    borrowed = history.occupy("n0000", 4, a_job().team("lender").estimate(86400))
    history.advance(10)
    owner = history.submit(a_job().team("owner").gpus(8))[0]
    history.advance(1)
    # Two GPUs are idle on n0001, where no reclaim of a whole node can land.
    small = history.submit(a_job().team("lender").gpus(2).estimate(600))[0]

    history.run()

    assert _evicted_by(history, owner) == {borrowed}
    assert history.job(small).placement == {"n0001": [6, 7]}
    assert history.auditor.violations == []


def test_a_borrower_behind_two_reclaims_of_one_shape_leaves_both_landings_alone() -> None:
    """The second reclaim's outcome comes from the first's (same shape, same snapshot: the
    memo of jobs behind the head); its landing is held all the same."""
    history = History("2x8:2:1")
    history.team("owner", guaranteed=16).team("lender")
    first_lent = history.occupy("n0000", 4, a_job().team("lender").estimate(86400))
    second_lent = history.occupy("n0001", 4, a_job().team("lender").estimate(86400))
    history.advance(10)
    first, second = history.submit(a_job().team("owner").gpus(8), a_job().team("owner").gpus(8))
    history.advance(1)
    short = history.submit(a_job().team("lender").gpus(4).estimate(600))[0]

    history.run(every_s=0.02)
    history.run(every_s=0.02)

    assert _evicted_by(history, first) | _evicted_by(history, second) == {
        first_lent,
        second_lent,
    }
    assert short not in _bound(history)
    assert history.auditor.violations == []


def test_no_landing_is_held_for_a_reclaim_the_first_reclaim_already_made_impossible() -> None:
    """review13: the place phase planned each waiting reclaim on the quota book as the cycle
    began, while the preemption phase charges each reclaim's victims as it makes it: two
    owner jobs in line both planned a gang of a lender borrowing only one gang's worth, so
    the second held the free GPUs beside its planned victim from the jobs behind it, for a
    reclaim the preemption phase then refused (the lender fell to its guarantee with the
    first). The hold returned every cycle while the first victim checkpointed (the book as
    the cycle began counts a leaving gang): the GPUs stayed idle with a job waiting for them.
    """
    history = History("3x8:3:1")
    history.team("owner", guaranteed=16).team("lender", guaranteed=4).team("infra")
    history.occupy("n0002", 8, a_job().team("infra").preemptible(False))
    first_lent = history.occupy("n0000", 4, a_job().team("lender").estimate(86400))
    second_lent = history.occupy("n0001", 4, a_job().team("lender").estimate(86400))
    history.advance(10)
    first, second = history.submit(a_job().team("owner").gpus(8), a_job().team("owner").gpus(8))
    history.advance(1)
    # A job of another team that needs four GPUs for ten minutes: n0001's four idle GPUs
    # serve it, as no reclaim may take n0001's borrowed gang once n0000's is taken.
    small = history.submit(a_job().team("infra").gpus(4).estimate(600))[0]

    history.run(every_s=0.02)
    history.run(every_s=0.02)

    # One reclaim only: the lender stays at its guarantee.
    evicted = _evicted_by(history, first) | _evicted_by(history, second)
    assert len(evicted) == 1 and evicted <= {first_lent, second_lent}
    # The idle GPUs beside the gang no reclaim takes went to the job waiting for them.
    [kept] = {first_lent, second_lent} - evicted
    assert history.job(small).placement == {
        node: [4, 5, 6, 7] for node in history.job(kept).placement
    }
    assert history.auditor.violations == []


def test_no_landing_is_held_for_a_reclaim_that_idle_gpus_serve_once_holds_are_given_back() -> None:
    """review13: the preemption phase plans with every hold given back (idle GPUs, held or
    not, serve a preemptor before any eviction does), the place phase planned with the holds
    of the jobs ahead taken out: a second owner's job that the first one's held landing would
    serve planned an eviction there, and held the free GPUs beside it from the jobs behind,
    for a reclaim the preemption phase refused, every cycle while the first's victim
    checkpointed."""
    history = History("3x8:3:1")
    history.team("owner", guaranteed=16).team("lender").team("infra")
    history.occupy("n0002", 8, a_job().team("infra").preemptible(False))
    gone = history.occupy("n0001", 2, a_job().team("infra"))
    first_lent = history.occupy("n0000", 4, a_job().team("lender").estimate(86400))
    history.occupy("n0001", 4, a_job().team("lender").estimate(86400))
    history.occupy("n0001", 2, a_job().team("infra").preemptible(False))
    history.exit(gone)  # n0001: GPUs 0 and 1 idle, 2 to 5 borrowed, 6 and 7 not preemptible
    history.advance(10)
    first, second = history.submit(a_job().team("owner").gpus(8), a_job().team("owner").gpus(4))
    history.advance(1)
    small = history.submit(a_job().team("infra").gpus(2).estimate(600))[0]

    history.run(every_s=0.02)
    history.run(every_s=0.02)

    assert _evicted_by(history, first) <= {first_lent}
    # n0001's two idle GPUs: no reclaim is made there while the first's victim checkpoints.
    if not _evicted_by(history, second):
        assert history.job(small).state == "running"
    assert history.auditor.violations == []
