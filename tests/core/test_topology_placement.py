"""Topology-aware best fit: tp groups on one NVLink domain, few racks, whole nodes kept free."""

from __future__ import annotations

from tests.core.builders import History, JobBuilder, a_job


def test_a_tp8_group_never_spans_nodes_even_when_enough_gpus_are_free_in_pieces() -> None:
    history = History("4x8:4:1")
    for _ in range(4):
        history.submit(a_job().gpus(5))  # every node has 3 free: 12 GPUs free, none 8 together
    history.run()
    tp_job = history.submit(a_job().gpus(1).tasks(8).tp(8))[0]

    history.run()

    assert history.state.free_gpus == 12
    assert history.job(tp_job).placement == {}
    assert history.job(tp_job).reason_code == "reserved_head"
    assert "tp groups of 8 GPUs each on one node" in (history.job(tp_job).reason or "")


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


def _required(cluster: str, busy: list[str], gang: JobBuilder) -> tuple[History, str]:
    """The gang submitted on a cluster whose `busy` nodes are taken whole."""
    history = History(cluster)
    for node in busy:
        history.occupy(node, 8)
    job = history.submit(gang)[0]
    history.run()
    return history, job


def test_require_node_waits_rather_than_spanning_nodes() -> None:
    """Two nodes have 4 free GPUs each: the 4-task gang fits them together, not one of them."""
    history = History("2x8:2:1")
    history.occupy("n0000", 4)
    history.occupy("n0001", 4)
    strict = history.submit(a_job().gpus(1).tasks(6).require("node"))[0]

    history.run()

    assert history.state.free_gpus == 8
    assert history.job(strict).placement == {}
    assert "in one NVLink domain" in (history.job(strict).reason or "")
    assert history.auditor.violations == []

    loose = History("2x8:2:1")
    loose.occupy("n0000", 4)
    loose.occupy("n0001", 4)
    spread = loose.submit(a_job().gpus(1).tasks(6))[0]
    loose.run()
    assert len(loose.job(spread).placement) == 2  # without `require` it spans both nodes


def test_require_rack_waits_rather_than_spanning_racks() -> None:
    """Racks r000 and r001 each keep one whole free node: two nodes are free, never in one rack."""
    cluster, busy = "4x8:2:2", ["n0000", "n0002"]
    strict_history, strict = _required(cluster, busy, a_job().gpus(8).tasks(2).require("rack"))
    loose_history, loose = _required(cluster, busy, a_job().gpus(8).tasks(2))

    assert strict_history.job(strict).placement == {}
    assert "in one rack" in (strict_history.job(strict).reason or "")
    assert strict_history.auditor.violations == []
    racks = {loose_history.state.node(n).rack for n in loose_history.job(loose).placement}  # type: ignore[union-attr]
    assert racks == {"r000", "r001"}


def test_require_block_waits_rather_than_spanning_blocks() -> None:
    """Each block keeps two whole free nodes: a 3-node gang fits only across blocks."""
    cluster, busy = "8x8:2:2", ["n0000", "n0002", "n0004", "n0006"]
    strict_history, strict = _required(cluster, busy, a_job().gpus(8).tasks(3).require("block"))
    loose_history, loose = _required(cluster, busy, a_job().gpus(8).tasks(3))

    assert strict_history.job(strict).placement == {}
    assert "in one block" in (strict_history.job(strict).reason or "")
    assert strict_history.auditor.violations == []
    blocks = {loose_history.state.node(n).block for n in loose_history.job(loose).placement}  # type: ignore[union-attr]
    assert len(blocks) == 2


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
