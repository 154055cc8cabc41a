"""A queue's CPU and memory ceilings count exactly what its subtree holds (core/quota.py:
QuotaBook's host usage): the gangs placed in earlier cycles, whatever of the two they ask, and
those this cycle places, to the last CPU and megabyte; a queue at its ceiling takes nothing
more, however small the ask; and the reason names the first ceiling that binds."""

from __future__ import annotations

from tests.core.builders import History, a_job
from tests.core.test_host_quota import CLUSTER, capped, reason


def test_a_cpu_ceiling_counts_earlier_cycles_gangs_and_this_cycles_to_the_last_cpu() -> None:
    history = capped(History(CLUSTER), "team-a", max_cpus=16)
    held = history.submit(a_job().cpu_only(4).tasks(3))[0]  # 12 CPUs and no memory
    history.run()
    assert history.job(held).state == "running"
    fill = history.submit(a_job().cpu_only(4))[0]  # the last 4 CPUs under the ceiling
    extra = history.submit(a_job().cpu_only(1))[0]

    history.run()

    assert history.job(fill).state == "running"
    assert history.job(extra).state == "queued"
    assert reason(history, extra) == (
        "quota_ceiling_cpus",
        "needs 1 task of 1 CPU, no GPU; queue team-a would exceed its ceiling of 16 CPUs",
    )
    assert history.auditor.violations == []


def test_a_memory_ceiling_holds_one_gang_asking_exactly_all_of_it() -> None:
    history = capped(History(CLUSTER), "team-a", max_memory_mb=8192)
    gang = history.submit(a_job().cpu_only(1).memory(4096).tasks(2))[0]

    history.run()

    assert history.job(gang).state == "running"


def test_two_gangs_that_fill_a_memory_ceiling_exactly_both_run_in_one_cycle() -> None:
    history = capped(History(CLUSTER), "team-a", max_memory_mb=8192)
    first = history.submit(a_job().cpu_only(1).memory(4096))[0]
    second = history.submit(a_job().cpu_only(1).memory(4096))[0]

    history.run()

    assert history.job(first).state == "running"
    assert history.job(second).state == "running"


def test_a_queue_at_its_memory_ceiling_takes_nothing_more_not_even_one_megabyte() -> None:
    history = capped(History(CLUSTER), "team-a", max_memory_mb=8192)
    history.submit(a_job().cpu_only(1).memory(8192))
    history.run()
    tiny = history.submit(a_job().cpu_only(1).memory(1))[0]

    history.run()

    assert history.job(tiny).state == "queued"
    assert reason(history, tiny)[0] == "quota_ceiling_memory"


def test_when_cpus_and_memory_bind_alike_the_reason_names_the_cpus_the_first_checked() -> None:
    history = capped(History(CLUSTER), "team-a", max_cpus=16, max_memory_mb=16_000)
    history.submit(a_job().cpu_only(4).memory(4000).tasks(3))  # 12 CPUs, 12000 MB
    history.run()
    waiting = history.submit(a_job().cpu_only(8).memory(8000))[0]  # neither has room

    history.run()

    assert reason(history, waiting)[0] == "quota_ceiling_cpus"


def test_when_a_queue_and_its_parent_are_full_alike_the_reason_names_the_queue_itself() -> None:
    history = capped(History(CLUSTER), "org", max_cpus=16)
    capped(history, "team-a", parent="org", max_cpus=16)
    history.submit(a_job().cpu_only(8).tasks(2))  # 16 CPUs: both ceilings full
    history.run()
    waiting = history.submit(a_job().cpu_only(4))[0]

    history.run()

    assert reason(history, waiting) == (
        "quota_ceiling_cpus",
        "needs 1 task of 4 CPUs, no GPU; queue team-a would exceed its ceiling of 16 CPUs",
    )
