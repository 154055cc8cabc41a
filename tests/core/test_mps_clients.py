"""An MPS server serves at most 48 clients on a GPU (core/sharing.py MAX_MPS_CLIENTS_PER_GPU):
each MPS share is one, so a GPU takes no more MPS shares, whatever thousandths are left. A
team's 200 shares of 0.001 went onto one GPU, and every rank past the 48th would have died in
CUDA's initialisation on real hardware."""

from __future__ import annotations

from collections import Counter

from core.admission import NodeShape
from core.sharing import MAX_MPS_CLIENTS_PER_GPU, SharingLedger, TaskAsk
from core.sharing_admission import fraction_rejection
from core.topology import parse_cluster_spec
from schemas.jobs import JobSpec
from tests.core.builders import History, JobBuilder, a_job

ONE_GPU = "groups:\n  - {count: 1, gpus: 1, gpu_type: H100}\n"


def ledger(spec: str) -> SharingLedger:
    book = SharingLedger()
    for node in parse_cluster_spec(spec):
        book.register(node)
    return book


def fill(book: SharingLedger, ask: TaskAsk, count: int) -> int:
    """Bind up to `count` tasks of `ask`; how many found a spot."""
    for placed in range(count):
        spot = book.place(ask, now=0)
        if spot is None:
            return placed
        book.bind(f"{ask.sharing}-{placed}", ask, spot)
    return count


def test_a_gpu_takes_48_mps_shares_however_small_and_then_none() -> None:
    book = ledger(ONE_GPU)
    tiny = TaskAsk(team="nlp", thousandths=1, sharing="mps")
    assert fill(book, tiny, 100) == MAX_MPS_CLIENTS_PER_GPU == 48
    assert book.nodes["n0000"].gpus[0].shared_thousandths == 48  # 952 thousandths left
    # One client gone, one more comes.
    book.release("mps-0")
    assert book.place(tiny, now=0) is not None
    assert book.problems() == []


def test_timeslice_shares_are_no_mps_clients() -> None:
    book = ledger(ONE_GPU)
    assert fill(book, TaskAsk(team="nlp", thousandths=1, sharing="mps"), 48) == 48
    # Time-sliced ranks are not clients of the GPU's MPS server: the thousandths bound them.
    timeslice = TaskAsk(team="nlp", thousandths=1, sharing="timeslice")
    assert fill(book, timeslice, 100) == 100
    assert book.place(TaskAsk(team="nlp", thousandths=1, sharing="mps"), now=0) is None


def a_share(fraction: float, tasks: int, sharing: str = "mps") -> JobBuilder:
    return a_job()._set(gpu_fraction=fraction, gpus_per_task=0, sharing=sharing).tasks(tasks)


def test_a_gang_of_200_tiny_mps_shares_spreads_over_gpus_48_at_most_to_each() -> None:
    history = History(cluster="groups:\n  - {count: 1, gpus: 8, gpu_type: H100}\n")
    [job] = history.submit(a_share(0.001, 200).team("team-a"))
    history.run()
    assert history.job(job).state == "running"
    per_gpu = Counter((rank.node_id, rank.gpus[0]) for rank in history.gang(job).ranks)
    assert sum(per_gpu.values()) == 200
    assert max(per_gpu.values()) <= MAX_MPS_CLIENTS_PER_GPU
    assert len(per_gpu) == 5  # 48 + 48 + 48 + 48 + 8: packed, not spread over all 8
    assert history.auditor.violations == []


def test_a_share_waiting_for_a_client_slot_says_so() -> None:
    history = History(cluster=ONE_GPU)
    [first] = history.submit(a_share(0.001, 48).team("team-a"))
    history.run()
    assert history.job(first).state == "running"
    [second] = history.submit(a_share(0.001, 1).team("team-a"))
    history.run()
    assert history.job(second).state == "queued"
    reason = history.deferrals(second)[-1]
    assert reason.code == "no_gpu_share"
    assert "room for another MPS client (48 a GPU)" in reason.message, reason.message


def spec(tasks: int, sharing: str = "mps") -> JobSpec:
    return JobSpec(
        name="tiny", team="t", tasks=tasks, gpu_fraction=0.001, sharing=sharing, command=["x"]
    )


def test_admission_refuses_a_gang_of_mps_shares_no_fleet_could_serve() -> None:
    nodes = [NodeShape("n0", "H100", 2, "r0", "b0", gpu_memory_mb=(81_559, 81_559))]
    assert fraction_rejection(spec(96), nodes, []) is None
    rejection = fraction_rejection(spec(97), nodes, [])
    assert rejection is not None and rejection[0] == "gang_too_large", rejection
    assert "can hold at most 96" in rejection[1]
    # Time-sliced, the thousandths are the bound: 1,000 a GPU.
    assert fraction_rejection(spec(2_000, "timeslice"), nodes, []) is None


TWO_NODES = "groups:\n  - {count: 2, gpus: 1, gpu_type: H100}\n"


def test_nodes_with_equal_fragmentation_keys_measure_alike_mps_clients_too() -> None:
    # fragmentation_key's contract: nodes with equal keys measure the same for any mix. A GPU
    # of 48 MPS shares takes no MPS share more; one of 47 MPS and 1 time-sliced share does,
    # with the same count of shares and thousandths.
    from core.sharing import fragmentation_key, node_fragmentation

    book = ledger(TWO_NODES)
    mps = TaskAsk(team="nlp", thousandths=1, sharing="mps")
    timeslice = TaskAsk(team="nlp", thousandths=1, sharing="timeslice")
    full, mixed = book.nodes["n0000"], book.nodes["n0001"]
    for i in range(48):
        book.bind(f"a{i}", mps, next(s for s in book.spots(mps, 0) if s.node_id == full.node_id))
    for i in range(47):
        book.bind(f"b{i}", mps, next(s for s in book.spots(mps, 0) if s.node_id == mixed.node_id))
    book.bind(
        "b-ts", timeslice, next(s for s in book.spots(timeslice, 0) if s.node_id == mixed.node_id)
    )
    mix = [(mps, 1.0)]
    assert node_fragmentation(full, mix, 0) != node_fragmentation(mixed, mix, 0)
    assert fragmentation_key(full, 0) != fragmentation_key(mixed, 0)


def test_the_ledgers_oracle_names_a_gpu_past_48_mps_clients() -> None:
    # problems() is the auditor's and the property tests' oracle: a log that put a 49th MPS
    # share on a GPU (placed before the cap held, or by a placement path that forgot it) is
    # a broken rule, as shares past 1000 thousandths are.
    from core.sharing import Spot

    book = ledger(ONE_GPU)
    tiny = TaskAsk(team="nlp", thousandths=1, sharing="mps")
    for i in range(MAX_MPS_CLIENTS_PER_GPU + 1):
        book.bind(f"s{i}", tiny, Spot("n0000", (0,), thousandths=1))
    assert any("MPS" in problem for problem in book.problems()), book.problems()


def test_fgd_tells_a_gpu_one_mps_client_short_of_full_from_one_with_room() -> None:
    # Two GPUs with as many shares, thousandths and memory: GPU 0's 47 shares are all MPS
    # clients, GPU 1's 46 and a time-sliced one. Another MPS share on GPU 0 fills its MPS
    # server, and GPU 0's 953 free thousandths are lost to every MPS share after; on GPU 1
    # nothing is lost. place() dropped GPU 1 as scoring the same as GPU 0 (alike_key).
    from core.sharing import Spot

    book = ledger("groups:\n  - {count: 1, gpus: 2, gpu_type: H100}\n")
    mps = TaskAsk(team="nlp", thousandths=1, sharing="mps")
    timeslice = TaskAsk(team="nlp", thousandths=1, sharing="timeslice")
    for i in range(47):
        book.bind(f"a{i}", mps, Spot("n0000", (0,), thousandths=1))
    for i in range(46):
        book.bind(f"b{i}", mps, Spot("n0000", (1,), thousandths=1))
    book.bind("b-ts", timeslice, Spot("n0000", (1,), thousandths=1))
    spot = book.place(mps, now=0, mix=[(mps.mix_key(), 1.0)])
    assert spot is not None and spot.gpus == (1,), spot
