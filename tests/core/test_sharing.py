"""Placing slices, shares, whole GPUs and CPU-only tasks on the ledger (core/sharing.py)."""

from __future__ import annotations

from core.mig import MigInstance
from core.regeometry import apply_decision, plan_regeometry
from core.sharing import SharingLedger, TaskAsk, ask_of, mix_of
from core.topology import parse_cluster_spec
from schemas.jobs import JobSpec


def ledger(spec: str) -> SharingLedger:
    book = SharingLedger()
    for node in parse_cluster_spec(spec):
        book.register(node)
    return book


SEVEN_SLICES = (
    "groups:\n  - {count: 1, gpus: 1, gpu_type: H100, mig: [" + ", ".join(["1g.10gb"] * 7) + "]}\n"
)


def test_seven_1g_10gb_inference_replicas_of_different_teams_share_one_h100() -> None:
    book = ledger(SEVEN_SLICES)
    for replica in range(7):
        ask = TaskAsk(team=f"team-{replica}", mig_profile="1g.10gb")
        spot = book.place(ask, now=0)
        assert spot is not None and spot.mig is not None
        book.bind(f"r{replica}", ask, spot)
    assert book.place(TaskAsk(team="late", mig_profile="1g.10gb"), now=0) is None
    gpu = book.nodes["n0000"].gpus[0]
    assert sorted(gpu.slices) == list(range(7))
    assert len({team for _, team in gpu.slices.values()}) == 7
    assert book.problems() == []
    # 7 slices of one compute slice each: the whole GPU's compute, counted exactly.
    assert book.allocated_gpus() == 1


def test_an_mps_gpu_is_shared_by_four_jobs_of_one_team_and_refused_to_another() -> None:
    book = ledger("groups:\n  - {count: 1, gpus: 1, gpu_type: H100}\n")
    for job in range(4):
        ask = TaskAsk(team="nlp", thousandths=250, sharing="mps")
        spot = book.place(ask, now=0)
        assert spot is not None and spot.gpus == (0,)
        book.bind(f"nlp-{job}", ask, spot)
    assert book.place(TaskAsk(team="vision", thousandths=1, sharing="mps"), now=0) is None
    # Even with room left, a second team never lands on a soft-shared GPU.
    book.release("nlp-0")
    assert book.place(TaskAsk(team="vision", thousandths=250), now=0) is None
    assert book.place(TaskAsk(team="nlp", thousandths=250), now=0) is not None
    for job in range(1, 4):
        book.release(f"nlp-{job}")
    assert book.place(TaskAsk(team="vision", thousandths=250), now=0) is not None
    assert book.problems() == []


def test_share_memory_is_bounded_by_the_gpu() -> None:
    book = ledger("groups:\n  - {count: 1, gpus: 1, gpu_type: H100}\n")
    big = TaskAsk(team="nlp", thousandths=100, gpu_memory_mb=60_000)
    spot = book.place(big, now=0)
    assert spot is not None
    book.bind("a", big, spot)
    assert book.place(big, now=0) is None


def test_a_slice_never_lands_on_a_whole_or_shared_gpu_and_a_whole_task_never_on_a_mig_one() -> None:
    book = ledger(
        "groups:\n"
        "  - {count: 1, gpus: 1, gpu_type: H100}\n"
        "  - {count: 1, gpus: 1, gpu_type: H100, mig: [3g.40gb, 4g.40gb]}\n"
    )
    whole = TaskAsk(team="a", whole_gpus=1)
    spot = book.place(whole, now=0)
    assert spot is not None and spot.node_id == "n0000"
    book.bind("w", whole, spot)
    assert book.place(whole, now=0) is None
    slice_ask = TaskAsk(team="a", mig_profile="3g.40gb")
    spot = book.place(slice_ask, now=0)
    assert spot is not None and spot.node_id == "n0001" and spot.mig == MigInstance(4, "3g.40gb")
    assert book.place(TaskAsk(team="a", thousandths=500), now=0) is None


def test_cpus_and_memory_are_node_resources_for_every_task() -> None:
    book = ledger("groups:\n  - {count: 1, gpus: 2, gpu_type: H100, cpus: 8, memory_mb: 65536}\n")
    cpu_only = ask_of(
        JobSpec(name="prep", team="nlp", gpus_per_task=0, cpus_per_task=6, memory_mb_per_task=1024)
    )
    assert cpu_only.kind == "cpu"
    spot = book.place(cpu_only, now=0)
    assert spot is not None and spot.gpus == ()
    book.bind("prep", cpu_only, spot)
    # Two GPUs are free, but only 2 CPUs are.
    assert book.place(TaskAsk(team="nlp", whole_gpus=1, cpus=4), now=0) is None
    assert book.place(TaskAsk(team="nlp", whole_gpus=1, cpus=2), now=0) is not None
    assert book.place(TaskAsk(team="nlp", whole_gpus=1, memory_mb=65_000), now=0) is None
    book.release("prep")
    book.release("prep")  # idempotent
    assert book.nodes["n0000"].cpus_used == 0
    assert book.place(TaskAsk(team="nlp", whole_gpus=1, cpus=8), now=0) is not None


def test_shares_pack_onto_a_used_gpu_and_leave_whole_gpus_for_gangs() -> None:
    """FGD: a quarter share goes next to other shares rather than opening an idle GPU."""
    book = ledger("groups:\n  - {count: 2, gpus: 8, gpu_type: H100}\n")
    mix = mix_of([TaskAsk(team="", whole_gpus=8), TaskAsk(team="", thousandths=250)] * 4)
    for job in range(8):
        ask = TaskAsk(team="nlp", thousandths=250)
        spot = book.place(ask, now=0, mix=mix)
        assert spot is not None
        book.bind(f"s{job}", ask, spot)
    busy = {(spot.node_id, spot.gpus) for _, spot in book.holders.values()}
    assert busy == {("n0000", (0,)), ("n0000", (1,))}
    # Node n0001 is whole: an 8-GPU gang task still fits there.
    spot = book.place(TaskAsk(team="x", whole_gpus=8), now=0, mix=mix)
    assert spot is not None and spot.node_id == "n0001"
    assert book.fragmentation(mix, now=0) > 0


def test_a_gpu_being_repartitioned_serves_nothing_until_it_is_ready() -> None:
    book = ledger("groups:\n  - {count: 1, gpus: 1, gpu_type: H100, mig: dynamic}\n")
    book.set_geometry("n0000", 0, [MigInstance(0, "7g.80gb")], now=100)
    ask = TaskAsk(team="a", mig_profile="7g.80gb")
    assert book.place(ask, now=159) is None
    assert book.place(ask, now=160) is not None


def test_a_gang_still_finds_whole_nodes_while_slices_and_shares_come_and_go() -> None:
    """FGD keeps small work together: after rounds of shares and slices arriving and leaving
    on a dynamic-MIG cluster, an 8-GPU task still finds a whole node every time."""
    book = ledger("groups:\n  - {count: 4, gpus: 8, gpu_type: H100, mig: dynamic}\n")
    small = [TaskAsk(team=f"t{n % 3}", thousandths=250) for n in range(6)] + [
        TaskAsk(team="infer", mig_profile="1g.10gb") for _ in range(6)
    ]
    mix = mix_of([*small, TaskAsk(team="", whole_gpus=8)])
    now = 0.0
    for round_number in range(5):
        for decision in plan_regeometry(book, small, now):
            apply_decision(book, decision, now)
        now += 600.0  # past the reconfiguration and the hold time
        placed = []
        for number, ask in enumerate(small):
            spot = book.place(ask, now, mix)
            if spot is not None:
                holder = f"r{round_number}-{number}"
                book.bind(holder, ask, spot)
                placed.append(holder)
        gang = TaskAsk(team="train", whole_gpus=8)
        spot = book.place(gang, now, mix)
        assert spot is not None, f"round {round_number}: no whole node left for the gang"
        for holder in placed[::2]:  # half the small work leaves
            book.release(holder)
        assert book.problems() == []
