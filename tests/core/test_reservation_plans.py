"""What the head's reservation waits for, and how the planner bounds its tries (DESIGN §3
"Backfill with reservations"; core/reservation.py).

The plan replays the ends of the running gangs: each gives back its GPUs and the CPUs and
memory its ranks hold; ranks of a released gang still stopping give back only GPUs (their CPUs
and memory were given back at release). The planner tries a placement after each of the first
`EAGER_TRIES` ends, then only once a further eighth of the head's need, and at least one unit
of it, is free since its last try: GPUs for a gang head, CPUs for a CPU-only head.
"""

from __future__ import annotations

import pytest

from core import SchedulingPolicy, reservation
from core.reservation import EAGER_TRIES, runtime_estimate
from schemas.jobs import ReservationPlanned
from tests.core.builders import T0, History, JobBuilder, a_job

HOUR = 3600.0
POLICY = SchedulingPolicy(overrun_grace_s=300.0)
# One node of 8 GPUs, 32 CPUs and 256 GiB.
ONE_HOST = "groups:\n  - {count: 1, gpus: 8, cpus: 32, memory_mb: 262144}\n"


def _planned(history: History, job_id: str) -> tuple[float, list[str]]:
    planned = history.events(ReservationPlanned, job_id)[-1]
    return planned.start_at.timestamp(), planned.nodes


# ------------------------------------------------- what a running gang gives back


def test_a_head_waiting_for_memory_a_running_gang_holds_is_planned_when_that_gang_ends() -> None:
    # Each node has 4 free GPUs but only 62 GB free beside a gang holding 200 GB; the head asks
    # 100 GB. n0's gang ends first (1 h), giving its memory back: the head starts there then.
    history = History("groups:\n  - {count: 2, gpus: 8, cpus: 32, memory_mb: 262144}\n")
    for node, hours in (("n0000", 1), ("n0001", 2)):
        history.occupy(node, 4, a_job().preemptible(False).estimate(hours * HOUR).memory(200_000))
    head = history.submit(a_job().gpus(1).memory(100_000))[0]

    history.cycle()

    assert history.job(head).reason_code == "reserved_head"
    assert _planned(history, head) == (T0 + HOUR, ["n0000"])


def test_gangs_ending_at_the_same_moment_are_all_gone_before_the_head_is_placed() -> None:
    # Three 8-GPU gangs end at the same moment (1 h), on n0 and n1 (rack r000) and on n2
    # (rack r001); n3 is busy for 2 h. The head, two 8-GPU tasks preferring one rack, is
    # planned at 1 h on the placement it prefers among everything free then: n0 and n1, not
    # on the first two nodes whose gangs the plan happens to count out (n0 and n2, two racks).
    history = History("4x8:2:1")
    for node in ("n0000", "n0002", "n0001"):
        history.occupy(node, 8, a_job().preemptible(False).estimate(HOUR))
    history.occupy("n0003", 8, a_job().preemptible(False).estimate(2 * HOUR))
    head = history.submit(a_job().gpus(8).tasks(2).prefer("rack"))[0]

    history.cycle()

    assert history.job(head).reason_code == "reserved_head"
    assert _planned(history, head) == (T0 + HOUR, ["n0000", "n0001"])


@pytest.mark.parametrize(
    "head",
    [
        a_job().gpus(4).cpus(16.001),  # a thousandth of a CPU more than is free beside the gang
        a_job().gpus(4).memory(131_073),  # one MB more than is free beside the gang
    ],
    ids=["cpus", "memory"],
)
def test_stopping_ranks_give_back_gpus_only_so_a_head_short_of_host_waits_for_the_gang(
    head: JobBuilder,
) -> None:
    # A running gang holds 4 GPUs, 16 CPUs and 128 GiB for 1 h. A cancelled gang's ranks still
    # stop on the other 4 GPUs; its CPUs and memory were given back at release. The head needs
    # those 4 GPUs and a little more CPU or memory than is free beside the running gang: the
    # stopping ranks' end (the overrun grace after now) is not enough, the gang's end is.
    history = History(ONE_HOST, POLICY)
    history.occupy("n0000", 4, a_job().preemptible(False).estimate(HOUR).cpus(16).memory(131_072))
    cancelled = history.occupy("n0000", 4, a_job().cpus(8).memory(65_536))
    history.cancel(cancelled)
    history.cycle()  # released; its ranks have not exited
    assert history.job(cancelled).state == "cancelled"
    history.advance(60)
    job_id = history.submit(head)[0]

    history.cycle()

    assert history.job(job_id).reason_code == "reserved_head"
    assert _planned(history, job_id) == (T0 + HOUR, ["n0000"])


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


# ------------------------------------------------- a CPU-only head's tries


def test_past_sixteen_failed_tries_a_cpu_only_head_is_retried_per_eighth_of_its_cpus_freed() -> (
    None
):
    # 68 one-CPU gangs end every 100 s round-robin over 4 nodes of 17 CPUs; the CPU-only head,
    # 17 one-CPU tasks on one node, first fits when n0 is empty: its last gang, the 65th end.
    # The planner tries at each of the first 16 ends (100 s to 1,600 s), then once a further
    # eighth of its 17 CPUs, rounded down (2.125 CPUs), has been freed since its last try:
    # every third end (1,900 s, 2,200 s, ...), so at 6,700 s, not at 6,500 s. Progress is
    # counted in CPUs for such a head: its gangs free no GPU.
    history = History("groups:\n  - {count: 4, gpus: 8, cpus: 17}\n")
    for k in range(1, 69):
        history.occupy(
            f"n000{(k - 1) % 4}", 0, a_job().cpu_only(1).preemptible(False).estimate(k * 100.0)
        )
    head = history.submit(a_job().cpu_only(1).tasks(17).require("node"))[0]

    history.cycle()

    assert EAGER_TRIES == 16
    assert history.job(head).reason_code == "reserved_head"
    assert _planned(history, head) == (T0 + 6700, ["n0000"])


def test_past_sixteen_failed_tries_a_gang_head_is_retried_per_eighth_of_its_gpus_freed() -> None:
    # 72 one-GPU gangs end every 100 s round-robin over 9 nodes in 3 racks; the head, 17
    # one-GPU tasks in one rack, first fits at the 47th end (rack r000 then has 17 free). The
    # planner tries from the 17th end, when 17 GPUs are free, at each of 16 ends (to 3,200 s),
    # then once a further eighth of its 17 GPUs, rounded down (2), has been freed since its
    # last try: every second end, so at 4,800 s.
    history = History("9x8:3:1")
    for k in range(1, 73):
        history.occupy(f"n000{(k - 1) % 9}", 1, a_job().preemptible(False).estimate(k * 100.0))
    head = history.submit(a_job().gpus(1).tasks(17).require("rack"))[0]

    history.cycle()

    assert history.job(head).reason_code == "reserved_head"
    assert _planned(history, head)[0] == T0 + 4800


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


# ------------------------------------------------- the estimate kept per job


def test_the_first_learned_estimate_of_a_process_is_computed_with_nothing_kept_yet(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Estimates are kept per job while the estimator learns nothing; a scheduler just started
    # has kept none yet (the module's memo is empty), and its first answer is the learned one.
    history = History("1x8")
    for _ in range(3):
        job_id = history.submit(a_job().named("train").gpus(1))[0]
        history.run()
        history.advance(HOUR)
        history.exit(job_id, 0)
        history.run()
    probe = history.submit(a_job().named("train").gpus(1))[0]
    job = history.state.job_records[probe]
    monkeypatch.setattr(reservation, "_memo", None)

    learned = runtime_estimate(job, history.policy, history.state.estimates)

    assert HOUR <= learned <= HOUR + 10
