"""FGD packing in the live cycle (issue 12 item 3): each slice or share goes where the
fragmentation of the held mix grows least, not merely onto the fullest GPU; and a restarted
scheduler (the ledger folded again from the log) measures and decides the same."""

from __future__ import annotations

import random
from typing import Literal

import pytest

from core.cycle import schedule
from core.mig import H100_80GB, pack
from core.policy import SchedulingPolicy
from core.sharing import SharingLedger, TaskAsk, node_fragmentation
from core.topology import parse_cluster_spec
from tests.core.builders import History
from tests.core.test_live_sharing import a_share, audit_clean, one_h100, placed_ranks


def two_shared_gpus(packing: Literal["fgd", "best-fit"]) -> tuple[History, str, str]:
    """Team lab holds a 0.4 share on one GPU (600/1000 free) and a 0.2 share on another
    (800/1000 free); returns (history, the 0.4's GPU node, the 0.2's GPU node)."""
    history = History(
        cluster=one_h100(mig="none", count=2), policy=SchedulingPolicy(sharing_packing=packing)
    )
    wide = history.submit(a_share(0.4, team="lab"))[0]
    history.run()
    filler = history.submit(a_share(0.7, team="lab"))[0]  # no room beside the 0.4: a new GPU
    history.run()
    small = history.submit(a_share(0.2, team="lab"))[0]
    history.run()
    wide_node = placed_ranks(history, wide)[0][0]
    small_node = placed_ranks(history, small)[0][0]
    assert placed_ranks(history, filler)[0][0] == small_node != wide_node
    history.exit(filler)
    history.run()
    return history, wide_node, small_node


@pytest.mark.parametrize(("packing", "lands_beside"), [("best-fit", "the 0.4"), ("fgd", "the 0.2")])
def test_fgd_keeps_room_a_held_task_type_can_use_where_best_fit_does_not(
    packing: Literal["fgd", "best-fit"], lands_beside: str
) -> None:
    """A 0.3 share: best fit takes the fullest GPU (beside the 0.4), leaving 300/1000 that no
    0.4 of the mix can use; FGD puts it beside the 0.2, leaving 600 and 500, both usable by
    every task type held (0.4, 0.2, 0.3)."""
    history, wide_node, small_node = two_shared_gpus(packing)
    third = history.submit(a_share(0.3, team="lab"))[0]
    history.run()
    assert history.job(third).state == "running"
    landed = placed_ranks(history, third)[0][0]
    assert landed == (wide_node if lands_beside == "the 0.4" else small_node)
    ledger = history.state.sharing.ledger
    mix = ledger.mix_with(history.state.sharing.ledger.holders[next(iter(ledger.holders))][0])
    unusable = ledger.fragmentation(mix, history.now)
    # Best fit strands 300/1000 the 0.4s cannot use; FGD strands nothing any held type needs.
    assert (unusable > 0) == (packing == "best-fit")
    audit_clean(history)


def test_a_restarted_scheduler_folds_the_same_ledger_and_places_the_same() -> None:
    """Replay of the log gives the same holds, the same held mix and the same FGD choice."""
    history, _, small_node = two_shared_gpus("fgd")
    replayed = history.replayed()
    live, again = history.state.sharing.ledger, replayed.sharing.ledger
    assert again.held_mix == live.held_mix
    assert {h: spot for h, (_, spot) in again.holders.items()} == {
        h: spot for h, (_, spot) in live.holders.items()
    }
    third = history.submit(a_share(0.3, team="lab"))[0]
    # The same submission, folded into the replayed state too.
    for event, at in history.log[-2:]:
        replayed.apply(event, at)
    ours = schedule(history.state, history.now + 1).decisions
    theirs = schedule(replayed, history.now + 1).decisions
    assert ours == theirs
    history.run()
    assert placed_ranks(history, third)[0][0] == small_node


@pytest.mark.parametrize("seed", range(6))
def test_the_one_gpu_growth_is_the_measures_own_difference(seed: int) -> None:
    """FGD scores a spot on one GPU by that GPU's part of the measure alone; on random ledgers
    (MIG, shares, whole tasks, CPUs and memory short or not) it equals the measure's own
    difference, before and after taking the spot."""
    rng = random.Random(seed)
    ledger = SharingLedger()
    spec = (
        "groups:\n"
        "  - {count: 3, gpus: 4, gpu_type: H100, mig: dynamic, cpus: 16, memory_mb: 65536}\n"
        "  - {count: 3, gpus: 4, gpu_type: H100, cpus: 8, memory_mb: 32768}\n"
    )
    for registered in parse_cluster_spec(spec):
        ledger.register(registered)
    cut = pack(H100_80GB, ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]) or ()
    for node_ledger in ledger.nodes.values():
        if node_ledger.mig == "dynamic":
            for gpu in node_ledger.gpus[:3]:
                gpu.geometry = cut
    kinds = [
        TaskAsk("a", thousandths=250, cpus=2),
        TaskAsk("a", thousandths=500, memory_mb=8192),
        TaskAsk("b", thousandths=300),
        TaskAsk("a", mig_profile="1g.10gb", cpus=4),
        TaskAsk("b", mig_profile="2g.20gb"),
        TaskAsk("a", whole_gpus=1, cpus=4),
        TaskAsk("a", cpus=3),
    ]
    for number in range(40):
        ask = rng.choice(kinds)
        spot = ledger.place(ask, 0.0, packing="best-fit")
        if spot is not None:
            ledger.bind(f"h{number}", ask, spot)
    mix = [(kind.mix_key(), float(rng.randint(1, 5))) for kind in kinds]
    compared = 0
    for ask in kinds:
        for spot in ledger.spots(ask, 0.0):
            if len(spot.gpus) != 1:
                continue
            node = ledger.nodes[spot.node_id]
            before = node_fragmentation(node, mix, 0.0)
            ledger.bind("probe", ask, spot)
            after = node_fragmentation(node, mix, 0.0)
            ledger.release("probe")
            fast = ledger._one_gpu_growth(node, ask, spot, mix, 0.0)
            assert fast == pytest.approx(after - before), (ask, spot)
            compared += 1
    assert compared >= 5
