"""Re-geometry is a scheduled decision: idle GPUs only, a cost during which the GPU serves
nothing, recorded as GpuGeometryChanged, and hysteresis so that geometries do not flap."""

from __future__ import annotations

from core.mig import H100_80GB, MigInstance, valid_geometry
from core.regeometry import apply_decision, plan_regeometry
from core.sharing import SharingLedger, TaskAsk
from core.topology import parse_cluster_spec
from schemas.nodes import GpuGeometryChanged

DYNAMIC = "groups:\n  - {count: 1, gpus: 2, gpu_type: H100, mig: dynamic, reconfigure_s: 60}\n"


def ledger(spec: str = DYNAMIC) -> SharingLedger:
    book = SharingLedger()
    for node in parse_cluster_spec(spec):
        book.register(node)
    return book


def slice_of(profile: str, team: str = "a") -> TaskAsk:
    return TaskAsk(team=team, mig_profile=profile)


def test_waiting_slices_get_a_geometry_recorded_with_its_cost() -> None:
    book = ledger()
    waiting = [slice_of("3g.40gb"), slice_of("2g.20gb"), slice_of("1g.10gb")]
    (decision,) = plan_regeometry(book, waiting, now=0)
    assert valid_geometry(H100_80GB, decision.geometry)
    assert {"3g.40gb", "2g.20gb", "1g.10gb"} <= {i.profile for i in decision.geometry}
    event = decision.event()
    assert isinstance(event, GpuGeometryChanged)
    assert (event.node_id, event.reconfigure_s, event.previous) == ("n0000", 60.0, [])
    apply_decision(book, decision, now=0)
    # During the reconfiguration the GPU serves nothing; then every waiting slice fits.
    assert all(book.place(ask, now=59) is None for ask in waiting)
    for number, ask in enumerate(waiting):
        spot = book.place(ask, now=60)
        assert spot is not None and spot.gpus == (decision.gpu_index,)
        book.bind(f"s{number}", ask, spot)
    assert book.problems() == []


def test_a_gpu_with_work_is_never_repartitioned_it_waits_to_drain() -> None:
    book = ledger("groups:\n  - {count: 1, gpus: 1, gpu_type: H100, mig: dynamic}\n")
    (first,) = plan_regeometry(book, [slice_of("1g.10gb")], now=0)
    apply_decision(book, first, now=0)
    ask = slice_of("1g.10gb")
    spot = book.place(ask, now=60)
    assert spot is not None
    book.bind("small", ask, spot)
    big = slice_of("7g.80gb")
    later = 10_000.0  # well past the hold time
    assert plan_regeometry(book, [big], now=later) == []
    book.release("small")
    (second,) = plan_regeometry(book, [big], now=later)
    assert second.geometry == (MigInstance(0, "7g.80gb"),)
    assert second.previous == first.geometry


def test_hysteresis_keeps_a_fresh_geometry_and_gives_whole_gpus_back_later() -> None:
    book = ledger("groups:\n  - {count: 1, gpus: 1, gpu_type: H100, mig: dynamic}\n")
    (cut,) = plan_regeometry(book, [slice_of("2g.20gb")], now=0)
    apply_decision(book, cut, now=0)
    gang_task = TaskAsk(team="b", whole_gpus=1)
    # 10 x reconfigure_s = 600 s hold: a whole-GPU ask right after does not undo the cut.
    assert plan_regeometry(book, [gang_task], now=300) == []
    (back,) = plan_regeometry(book, [gang_task], now=600)
    assert back.geometry == () and back.reason.startswith("a whole GPU")
    apply_decision(book, back, now=600)
    assert book.place(gang_task, now=600) is None  # still reconfiguring
    assert book.place(gang_task, now=660) is not None


def test_no_repartition_when_a_free_instance_already_fits() -> None:
    book = ledger()
    (cut,) = plan_regeometry(book, [slice_of("1g.10gb")], now=0)
    apply_decision(book, cut, now=0)
    assert plan_regeometry(book, [slice_of("1g.10gb")], now=60) == []


def test_fixed_and_mig_less_nodes_are_never_repartitioned() -> None:
    book = ledger(
        "groups:\n"
        "  - {count: 1, gpus: 1, gpu_type: H100, mig: [7g.80gb]}\n"
        "  - {count: 1, gpus: 1, gpu_type: H100}\n"
    )
    assert plan_regeometry(book, [slice_of("1g.10gb")], now=0) == []
