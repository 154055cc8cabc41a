"""Topology-aware best fit: tp groups on one NVLink domain, few racks, whole nodes kept free."""

from __future__ import annotations

from tests.core.builders import History, a_job


def test_a_tp8_group_never_spans_nodes_even_when_enough_gpus_are_free_in_pieces() -> None:
    history = History("4x8:4:1")
    for _ in range(4):
        history.submit(a_job().gpus(5))  # every node has 3 free: 12 GPUs free, none 8 together
    history.run()
    tp_job = history.submit(a_job().gpus(1).tasks(8).tp(8))[0]

    history.run()

    assert history.state.free_gpus == 12
    assert history.job(tp_job).placement == {}
    assert history.job(tp_job).reason_code is not None


def test_tp_groups_of_consecutive_ranks_share_a_node() -> None:
    history = History("4x8:4:1")
    job = history.submit(a_job().gpus(2).tasks(8).tp(4))[0]

    history.run()

    gang = history.gang(job)
    by_rank = {r.rank: r.node_id for r in gang.ranks}
    for group_start in range(0, 8, 2):
        assert by_rank[group_start] == by_rank[group_start + 1]


def test_a_small_job_fills_a_partly_used_node_and_keeps_whole_nodes_free() -> None:
    history = History("4x8:4:1")
    first = history.submit(a_job().gpus(6))[0]
    history.run()
    small = history.submit(a_job().gpus(2))[0]

    history.run()

    assert list(history.job(small).placement) == list(history.job(first).placement)
    whole_free = [n for n in history.state.nodes() if n.free_gpus == 8]
    assert len(whole_free) == 3


def test_a_gang_that_fits_one_rack_is_placed_in_one_rack() -> None:
    history = History("16x8:4:2")
    history.submit(a_job().gpus(8).tasks(3))  # rack r000 partly used
    history.run()
    job = history.submit(a_job().gpus(8).tasks(4))[0]

    history.run()

    racks = {history.state.node(n).rack for n in history.job(job).placement}  # type: ignore[union-attr]
    assert len(racks) == 1


def test_require_rack_waits_rather_than_spanning_racks() -> None:
    history = History("8x8:4:2")
    history.submit(a_job().gpus(8).tasks(1), a_job().gpus(8).tasks(1))
    history.run()
    # Each rack has 3 whole nodes left; the job needs 4 in one rack.
    placed = history.state.jobs()
    racks_used = {history.state.node(n).rack for v in placed for n in v.placement}  # type: ignore[union-attr]
    assert len(racks_used) in (1, 2)
    strict = history.submit(a_job().gpus(8).tasks(7).require("rack"))[0]

    history.run()

    assert history.job(strict).placement == {}


def test_a_gpu_type_filter_places_only_on_that_type() -> None:
    spec = "groups:\n- {count: 2, gpus: 8, gpu_type: A100}\n- {count: 2, gpus: 8, gpu_type: H100}\n"
    history = History(spec)
    job = history.submit(a_job().gpus(8).tasks(2).gpu_type("H100"))[0]

    history.run()

    types = {history.state.node(n).gpu_type for n in history.job(job).placement}  # type: ignore[union-attr]
    assert types == {"H100"}


def test_nothing_lands_on_drained_lost_or_unhealthy_hardware() -> None:
    history = History("4x8:4:1")
    history.lose("n0000")
    history.drain("n0001")
    history.break_gpu("n0002", 3)
    jobs = history.submit(*(a_job().gpus(1) for _ in range(20)))

    history.run()

    used = {(n, g) for j in jobs for n, gpus in history.job(j).placement.items() for g in gpus}
    assert not any(n in ("n0000", "n0001") for n, _ in used)
    assert ("n0002", 3) not in used
    assert len(used) == 15  # 7 healthy GPUs on n0002 and 8 on n0003
