"""Which waiting job is the head whose reservation backfill must respect."""

from __future__ import annotations

from tests.core.builders import History, a_job

MIXED = (
    "groups:\n"
    "- {count: 2, gpus: 8, gpu_type: H100, rack_size: 2, racks_per_block: 1}\n"
    "- {count: 2, gpus: 8, gpu_type: A100, rack_size: 2, racks_per_block: 1}\n"
)


def settle(history: History) -> None:
    """One cycle; the agents start what was bound but stop nothing (ranks of released gangs
    run on until they report their exit)."""
    history.cycle()
    history.start_all()


def test_a_job_whose_reservation_cannot_be_planned_leaves_the_head_to_the_next_in_line() -> None:
    """Three GPUs of each H100 node are broken (5 healthy each): a gang of three 3-GPU H100
    tasks, first in line, passes the cluster's capacity check (10 GPUs, units of 3) yet fits
    nowhere even once every running gang ends (one unit per node). It holds no reservation,
    so the A100 gang behind it stays the head and keeps its nodes: a long 1-GPU job may not
    backfill onto them. (Found by the random property tests, where a rank of a released gang
    held the only node a job could use; such ranks are now planned to end, see
    test_reservation_rules.py.)"""
    history = History(MIXED)  # H100: n0000, n0001; A100: n0002, n0003
    for node in ("n0000", "n0001"):
        for gpu in (5, 6, 7):
            history.break_gpu(node, gpu)
    history.submit(*(a_job().gpus(4).gpu_type("A100").estimate(1000) for _ in range(2)))
    settle(history)
    big = history.submit(a_job().gpus(8).tasks(2).gpu_type("A100"))[0]
    long = history.submit(a_job().gpus(1).gpu_type("A100").estimate(5000))[0]
    settle(history)
    assert history.job(big).reason_code == "reserved_head"
    assert history.job(long).reason_code == "backfill_blocked"

    first = history.submit(
        a_job().gpus(3).tasks(3).gpu_type("H100").priority("inference-critical")
    )[0]
    settle(history)

    assert history.job(first).reason == (
        "needs 9 GPUs (3 tasks x 3) of type H100; it does not fit even when the running gangs end"
    )
    assert history.job(big).reason_code == "reserved_head"
    assert history.job(long).state == "queued"
    assert history.job(long).reason_code == "backfill_blocked"
    assert history.auditor.violations == []
