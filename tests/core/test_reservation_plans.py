"""What the head's reservation waits for, and how the planner bounds its tries (DESIGN §3
"Backfill with reservations"; core/reservation.py).

The plan replays the ends of the running gangs: each gives back its GPUs and the CPUs and
memory its ranks hold; ranks of a released gang still stopping give back only GPUs (their CPUs
and memory were given back at release). The planner tries a placement after each of the first
`EAGER_TRIES` ends, then only once a further eighth of the head's need, and at least one unit
of it, is free since its last try: GPUs for a gang head, CPUs for a CPU-only head.
"""

from __future__ import annotations

from core import SchedulingPolicy
from schemas.jobs import ReservationPlanned
from tests.core.builders import T0, History, a_job

HOUR = 3600.0
POLICY = SchedulingPolicy(overrun_grace_s=300.0)
# One node of 8 GPUs, 32 CPUs and 256 GiB.
ONE_HOST = "groups:\n  - {count: 1, gpus: 8, cpus: 32, memory_mb: 262144}\n"


def _planned(history: History, job_id: str) -> tuple[float, list[str]]:
    planned = history.events(ReservationPlanned, job_id)[-1]
    return planned.start_at.timestamp(), planned.nodes


# ------------------------------------------------- what a released gang gives back


def test_in_the_cycle_that_releases_a_gang_its_stopping_ranks_hold_gpus_but_no_cpus() -> None:
    # A running gang holds 4 GPUs and 16 CPUs for 1 h; the other gang on the node is cancelled
    # in the very cycle the head (4 GPUs, 16 CPUs) is first planned. Its ranks still stop on
    # their GPUs, but its CPUs are free from its release, in this cycle as in the next: the
    # head is planned there the overrun grace after now, not when the running gang ends (it
    # was, for the one cycle that released the gang).
    history = History(ONE_HOST, POLICY)
    history.occupy("n0000", 4, a_job().preemptible(False).estimate(HOUR).cpus(16))
    cancelled = history.occupy("n0000", 4, a_job().cpus(16))
    history.cancel(cancelled)
    head = history.submit(a_job().gpus(4).cpus(16))[0]

    history.cycle()

    assert history.job(cancelled).state == "cancelled"
    assert history.job(head).reason_code == "reserved_head"
    assert _planned(history, head) == (T0 + POLICY.overrun_grace_s, ["n0000"])


# ------------------------------------------------- the planner's last look


def test_a_gpu_head_waiting_for_cpus_that_cpu_only_gangs_free_after_its_last_try_is_planned() -> (
    None
):
    # 24 one-GPU gangs (8 per node, every 100 s) use up the planner's 16 eager tries and the
    # tries after each GPU they free; the head also needs a node's 8 CPUs, held on each node by
    # a CPU-only gang ending later (10,000 s, 20,000 s, 30,000 s). Those free no GPU, so the
    # loop tries no more after them; the last look at the fully released plan still finds the
    # head its start (coarse there: no earlier than n0's CPUs are free, at most the last end).
    # It used to get no reservation: "it does not fit even when the running gangs end".
    history = History("groups:\n  - {count: 3, gpus: 8, cpus: 8}\n")
    for k in range(1, 25):
        history.occupy(f"n000{(k - 1) % 3}", 1, a_job().preemptible(False).estimate(k * 100.0))
    for node, seconds in (("n0000", 10_000.0), ("n0001", 20_000.0), ("n0002", 30_000.0)):
        history.occupy(node, 0, a_job().cpu_only(1).preemptible(False).estimate(seconds))
    head = history.submit(a_job().gpus(1).cpus(8))[0]

    history.cycle()

    assert history.job(head).reason_code == "reserved_head"
    start, _ = _planned(history, head)
    assert T0 + 10_000 <= start <= T0 + 30_000
