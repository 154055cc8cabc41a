"""The sharing ledger's free-capacity index (core/sharing_index.py) changes no decision: on
random clusters of every GPU model and MIG mode, after any sequence of placements, releases,
re-partitions and time passing, an indexed ledger places every task, best fit and FGD, exactly
where a ledger without the index does."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from core.mig import H100_80GB, pack
from core.regeometry import apply_decision, plan_regeometry
from core.sharing import Packing, SharingLedger, TaskAsk, mix_of
from core.topology import parse_cluster_spec
from tests.core.test_sharing_properties import (
    Place,
    Release,
    Repartition,
    Wait,
    asks,
    clusters,
    steps,
)


def ledgers(cluster: str) -> tuple[SharingLedger, SharingLedger]:
    plain, indexed = SharingLedger(), SharingLedger(indexed=True)
    for node in parse_cluster_spec(cluster):
        plain.register(node)
        indexed.register(node)
    return plain, indexed


@given(
    cluster=clusters(),
    plan=steps,
    packing=st.sampled_from(["fgd", "best-fit"]),
    shortlist=st.sampled_from([2, 3, 64]),
)
def test_an_indexed_ledger_places_every_task_where_a_plain_one_does(
    cluster: str,
    plan: list[Place | Release | Repartition | Wait],
    packing: Packing,
    shortlist: int,
) -> None:
    plain, indexed = ledgers(cluster)
    now = 0.0
    seen: list[TaskAsk] = []
    for number, step in enumerate(plan):
        if isinstance(step, Place):
            seen.append(step.ask)
            mix = mix_of(seen[-32:])
            # A short FGD shortlist: which spots make it (one of GPUs alike) matters.
            spot = plain.place(step.ask, now, mix, packing=packing, shortlist=shortlist)
            assert indexed.place(step.ask, now, mix, packing=packing, shortlist=shortlist) == spot
            # The other packing too, on the same ledger: both read the same index.
            other: Packing = "best-fit" if packing == "fgd" else "fgd"
            assert indexed.place(step.ask, now, mix, packing=other) == plain.place(
                step.ask, now, mix, packing=other
            )
            if spot is not None:
                plain.bind(f"t{number}", step.ask, spot)
                indexed.bind(f"t{number}", step.ask, spot)
        elif isinstance(step, Release) and plain.holders:
            holder = sorted(plain.holders)[step.pick % len(plain.holders)]
            plain.release(holder)
            indexed.release(holder)
        elif isinstance(step, Repartition):
            for decision in plan_regeometry(plain, step.waiting, now):
                apply_decision(plain, decision, now)
                apply_decision(indexed, decision, now)
        elif isinstance(step, Wait):
            now += step.seconds


@given(ask=asks())
def test_a_geometry_cut_behind_the_ledgers_back_and_told_is_indexed(ask: TaskAsk) -> None:
    spec = (
        "groups:\n"
        "  - {count: 3, gpus: 4, gpu_type: H100, mig: dynamic, cpus: 64, memory_mb: 65536}\n"
    )
    plain, indexed = ledgers(spec)
    geometry = pack(H100_80GB, ["1g.10gb"] * 7) or ()
    for book in (plain, indexed):
        for gpu in book.nodes["n0001"].gpus[:2]:
            gpu.geometry = geometry
        book.changed("n0001")

    assert indexed.place(ask, 0.0, packing="best-fit") == plain.place(ask, 0.0, packing="best-fit")
    assert indexed.place(ask, 0.0) == plain.place(ask, 0.0)
