"""A GPU is re-partitioned for a waiting slice only on a node whose CPUs and memory can host the
slice's task: cutting one elsewhere serves nobody, and the slice, still waiting, had the next
idle GPU cut in the next cycle.

Found by the hostile-tenant run: one job of a 1g.10gb slice asking more CPUs than any node has
had every idle GPU of both `mig: dynamic` nodes cut into 1g.10gb instances within two seconds,
leaving whole-GPU gangs sixteen GPUs fewer for the hold time."""

from __future__ import annotations

from core.regeometry import apply_decision, plan_regeometry
from core.sharing import SharingLedger, TaskAsk
from core.topology import parse_cluster_spec


def ledger(spec: str) -> SharingLedger:
    book = SharingLedger()
    for node in parse_cluster_spec(spec):
        book.register(node)
    return book


def cycles(book: SharingLedger, waiting: list[TaskAsk], count: int) -> list[str]:
    """`count` scheduling cycles a second apart, each applying what it decides: the GPUs cut."""
    cut = []
    for now in range(count):
        for decision in plan_regeometry(book, waiting, now=float(now)):
            apply_decision(book, decision, now=float(now))
            cut.append(f"{decision.node_id}/{decision.gpu_index}")
    return cut


def test_a_slice_no_node_can_host_cuts_no_gpu_however_long_it_waits() -> None:
    book = ledger(
        "groups:\n"
        "  - {count: 2, gpus: 4, gpu_type: H100, cpus: 8, mig: dynamic, reconfigure_s: 5}\n"
    )
    greedy = TaskAsk(team="a", mig_profile="1g.10gb", cpus=16)

    assert cycles(book, [greedy], count=10) == []
    assert all(not gpu.geometry for node in book.nodes.values() for gpu in node.gpus)


def test_the_cut_goes_to_a_node_that_can_host_the_task() -> None:
    """n0000 has the fewest idle GPUs (the usual choice, to keep whole nodes whole) but only
    8 CPUs; the slice asks 16, so n0001's GPU is cut, once."""
    book = ledger(
        "groups:\n"
        "  - {count: 1, gpus: 2, gpu_type: H100, cpus: 8, mig: dynamic, reconfigure_s: 5}\n"
        "  - {count: 1, gpus: 8, gpu_type: H100, cpus: 64, mig: dynamic, reconfigure_s: 5}\n"
    )
    ask = TaskAsk(team="a", mig_profile="1g.10gb", cpus=16)

    assert cycles(book, [ask], count=10) == ["n0001/0"]
