"""Gangs are bound whole or not at all, and a waiting gang holds nothing."""

from __future__ import annotations

from schemas.jobs import GangReserved
from tests.core.builders import History, a_job


def test_two_64_gpu_gangs_on_100_free_gpus_run_one_and_the_other_holds_nothing() -> None:
    history = History("16x8:4:2")  # 128 GPUs
    filler = a_job().gpus(4).tasks(7)  # 28 GPUs busy: 100 free
    history.submit(filler)
    history.run()
    first, second = history.submit(a_job().gpus(8).tasks(8), a_job().gpus(8).tasks(8))

    history.run()

    assert history.job(first).state == "running"
    assert history.job(second).state == "queued"
    assert history.job(second).placement == {}
    assert history.state.allocated_gpus == 28 + 64


def test_a_coordinator_plus_workers_gang_does_not_take_the_last_slots_without_its_workers() -> None:
    history = History("2x8:2:1")
    history.submit(a_job().gpus(4).tasks(3))  # 12 of 16 GPUs busy, 4 free
    history.run()
    gang = history.submit(a_job().gpus(1).tasks(5))[0]  # coordinator + 4 workers

    history.run()

    assert history.job(gang).placement == {}
    assert history.state.allocated_gpus == 12


def test_an_elastic_gang_takes_as_many_tasks_as_fit_above_its_minimum() -> None:
    history = History("2x8:2:1")
    history.submit(a_job().gpus(4).tasks(3))
    history.run()
    elastic = history.submit(a_job().gpus(1).tasks(8).min_tasks(2))[0]

    history.run()

    assert history.job(elastic).state == "running"
    assert history.bound_gpus(elastic) == 4


def test_an_elastic_gang_below_its_minimum_waits_holding_nothing() -> None:
    history = History("1x8:1:1")
    history.submit(a_job().gpus(7))
    history.run()
    elastic = history.submit(a_job().gpus(1).tasks(8).min_tasks(2))[0]

    history.run()

    assert history.job(elastic).placement == {}


def test_one_gang_reserved_event_binds_every_rank_at_once() -> None:
    history = History("16x8:4:2")
    job = history.submit(a_job().gpus(8).tasks(6))[0]

    history.cycle()

    gangs = history.events(GangReserved, job)
    assert len(gangs) == 1
    assert sorted(r.rank for r in gangs[0].ranks) == list(range(6))
