"""Properties of the sharing ledger: after any sequence of placements, releases and
re-partitions, on every GPU model of the tables, every geometry is valid for its model, no
slice or share is double-booked, no GPU is oversubscribed (shares within 1000 thousandths and
the GPU's memory), a soft-shared GPU never hosts two teams, no node gives more CPUs or memory
than it has, and what is allocated adds up in exact fractions."""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from hypothesis import given
from hypothesis import strategies as st

from core.mig import MIG_MODELS
from core.regeometry import apply_decision, plan_regeometry
from core.sharing import FULL, SharingLedger, TaskAsk, held_gpus, mix_of
from core.topology import parse_cluster_spec
from tests.core.test_mig import _oracle

MODELS = {"H100": "H100-80GB", "A100": "A100-40GB", "A100-80": "A100-80GB", "H200": "H200-141GB"}
TEAMS = ("alpha", "beta", "gamma")


@st.composite
def clusters(draw: st.DrawFn) -> str:
    lines = ["groups:"]
    for _ in range(draw(st.integers(1, 3))):
        gpu_type = draw(st.sampled_from(sorted(MODELS)))
        model = MIG_MODELS[MODELS[gpu_type]]
        mig = draw(st.sampled_from(["none", "dynamic", "fixed"]))
        if mig == "fixed":
            name = draw(st.sampled_from(sorted(model.profiles)))
            mig = "[" + name + "]"
        lines.append(
            f"  - {{count: {draw(st.integers(1, 2))}, gpus: {draw(st.integers(1, 4))}, "
            f"gpu_type: {gpu_type}, gpu_model: {model.name}, mig: {mig}, "
            f"cpus: {draw(st.integers(4, 64))}, memory_mb: {draw(st.integers(8, 512)) * 1024}, "
            f"reconfigure_s: {draw(st.sampled_from([0, 30, 60]))}}}"
        )
    return "\n".join(lines) + "\n"


@st.composite
def asks(draw: st.DrawFn) -> TaskAsk:
    team = draw(st.sampled_from(TEAMS))
    cpus = float(draw(st.integers(0, 8)))
    memory = draw(st.integers(0, 16)) * 1024
    kind = draw(st.sampled_from(["whole", "mig", "share", "share", "cpu"]))
    if kind == "whole":
        return TaskAsk(team, whole_gpus=draw(st.integers(1, 4)), cpus=cpus, memory_mb=memory)
    if kind == "mig":
        model = MIG_MODELS[draw(st.sampled_from(sorted(MIG_MODELS)))]
        profile = draw(st.sampled_from(sorted(model.profiles)))
        return TaskAsk(team, mig_profile=profile, cpus=cpus, memory_mb=memory)
    if kind == "share":
        return TaskAsk(
            team,
            thousandths=draw(st.sampled_from([125, 250, 333, 500, 750])),
            gpu_memory_mb=draw(st.none() | st.integers(1, 50_000)),
            sharing=draw(st.sampled_from(["mps", "timeslice"])),
            cpus=cpus,
            memory_mb=memory,
        )
    return TaskAsk(team, cpus=max(cpus, 1.0), memory_mb=memory)


@dataclass(frozen=True)
class Place:
    ask: TaskAsk


@dataclass(frozen=True)
class Release:
    pick: int


@dataclass(frozen=True)
class Repartition:
    waiting: tuple[TaskAsk, ...]


@dataclass(frozen=True)
class Wait:
    seconds: float


steps = st.lists(
    st.one_of(
        asks().map(Place),
        asks().map(Place),
        st.integers(0, 1000).map(Release),
        st.lists(asks(), max_size=6).map(lambda a: Repartition(tuple(a))),
        st.sampled_from([1.0, 60.0, 900.0]).map(Wait),
    ),
    max_size=40,
)


def check(book: SharingLedger) -> None:
    assert book.problems() == []
    booked: set[tuple[str, int, int]] = set()
    for node in book.nodes.values():
        model = node.model
        for gpu in node.gpus:
            if gpu.geometry:
                assert model is not None and _oracle(model, gpu.geometry)
            assert gpu.shared_thousandths <= FULL
            assert gpu.shared_memory_mb <= gpu.memory_mb
            assert len({share.team for share in gpu.shares.values()}) <= 1
            assert sum((gpu.whole is not None, bool(gpu.slices), bool(gpu.shares))) <= 1
        if node.cpus is not None:
            assert node.cpus_used <= node.cpus + 1e-9
        if node.memory_mb is not None:
            assert node.memory_used <= node.memory_mb
    for _ask, spot in book.holders.values():
        if spot.mig is not None:
            key = (spot.node_id, spot.gpus[0], spot.mig.start)
            assert key not in booked, f"slice {key} booked twice"
            booked.add(key)
    # Exact accounting: what holders count sums to the ledger's allocation, never above capacity.
    exact = sum(
        (held_gpus(book.nodes[s.node_id], a, s) for a, s in book.holders.values()), Fraction(0)
    )
    assert exact == book.allocated_gpus()
    assert exact <= sum(len(node.gpus) for node in book.nodes.values())


@given(cluster=clusters(), plan=steps)
def test_any_sequence_keeps_every_gpu_valid_and_never_oversubscribed(
    cluster: str, plan: list[Place | Release | Repartition | Wait]
) -> None:
    book = SharingLedger()
    for node in parse_cluster_spec(cluster):
        book.register(node)
    now = 0.0
    seen: list[TaskAsk] = []
    for number, step in enumerate(plan):
        if isinstance(step, Place):
            seen.append(step.ask)
            spot = book.place(step.ask, now, mix_of(seen[-32:]))
            if spot is not None:
                book.bind(f"t{number}", step.ask, spot)
        elif isinstance(step, Release) and book.holders:
            holders = sorted(book.holders)
            book.release(holders[step.pick % len(holders)])
        elif isinstance(step, Repartition):
            for decision in plan_regeometry(book, step.waiting, now):
                gpu = book.nodes[decision.node_id].gpus[decision.gpu_index]
                assert gpu.idle, "a GPU with work was re-partitioned"
                apply_decision(book, decision, now)
        elif isinstance(step, Wait):
            now += step.seconds
        check(book)
