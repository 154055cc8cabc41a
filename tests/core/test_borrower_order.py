"""Borrowers carry no fair-share penalty (DESIGN §3 "Order within a class", core/ordering.py): a
job of a team with a guarantee that would run beyond it is ordered among the borrowers as if its
team had used nothing, whatever the size of the guarantee; a team without a guarantee divides
everything by fair share, so what it has used counts."""

from __future__ import annotations

from tests.core.builders import History, a_job


def _lent_node_freed(history: History, first_team: str, second_team: str) -> tuple[str, str]:
    """The node is busy with a third team's gang; each team's whole-node job waits for it, the
    first team's a minute earlier; then the gang ends and one cycle runs."""
    busy = history.occupy("n0000", 8, a_job().preemptible(False).team("infra"))
    first = history.submit(a_job().gpus(8).team(first_team))[0]
    history.advance(60)
    second = history.submit(a_job().gpus(8).team(second_team))[0]
    history.run()
    history.exit(busy, 0)
    history.run()
    return first, second


def test_a_team_guaranteed_one_gpu_borrows_in_arrival_order_whatever_it_used_before() -> None:
    history = History("1x8:1:1")
    history.team("heavy", guaranteed=1).team("light", guaranteed=1).team("infra")
    hog = history.submit(a_job().gpus(8).team("heavy"))[0]  # borrows 7 GPUs for a day
    history.run()
    history.advance(24 * 3600)
    history.exit(hog, 0)
    history.run()

    heavy, light = _lent_node_freed(history, "heavy", "light")

    assert history.job(heavy).state == "running"
    assert history.job(light).state == "queued"
    assert history.auditor.violations == []


def test_a_borrower_of_a_guaranteed_team_goes_before_a_team_without_guarantee_that_used_gpus() -> (
    None
):
    """The team without a guarantee used one GPU for an hour (a small fair share, well under
    one GPU on average); the borrower of the guaranteed team counts as having used nothing."""
    history = History("1x8:1:1")
    history.team("adhoc").team("owner", guaranteed=4).team("infra")
    small = history.submit(a_job().gpus(1).team("adhoc"))[0]
    history.run()
    history.advance(3600)
    history.exit(small, 0)
    history.run()

    adhoc, owner = _lent_node_freed(history, "adhoc", "owner")

    assert history.job(owner).state == "running"  # 8 GPUs: beyond its guarantee of 4
    assert history.job(adhoc).state == "queued"
    assert history.auditor.violations == []
