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
    """Twelve GPUs are free, as 6 + 6, for a coordinator and 11 workers in tp groups of 4 ranks
    on one node: two groups fit, the third nowhere, so none is placed."""
    history = History("2x8:2:1")
    history.occupy("n0000", 2)
    history.occupy("n0001", 2)
    gang = history.submit(a_job().gpus(1).tasks(12).tp(4))[0]

    history.run()

    assert history.state.free_gpus == 12
    assert history.job(gang).placement == {}
    assert history.events(GangReserved, gang) == []
    assert history.state.allocated_gpus == 4


def test_an_elastic_gang_takes_as_many_tasks_as_fit_above_its_minimum() -> None:
    history = History("2x8:2:1")
    history.submit(a_job().gpus(4).tasks(3))
    history.run()
    elastic = history.submit(a_job().gpus(1).tasks(8).min_tasks(2))[0]

    history.run()

    assert history.job(elastic).state == "running"
    assert history.bound_gpus(elastic) == 4


def test_an_elastic_gang_below_its_minimum_waits_holding_nothing() -> None:
    """Eight GPUs are free, enough for the minimum's GPUs, but only as 2 + 6: one 4-GPU task
    fits, and the minimum is two."""
    history = History("2x8:2:1")
    history.occupy("n0000", 6)
    history.occupy("n0001", 2)
    elastic = history.submit(a_job().gpus(4).tasks(4).min_tasks(2))[0]

    history.run()

    assert history.state.free_gpus == 8
    assert history.job(elastic).placement == {}
    assert history.events(GangReserved, elastic) == []


def test_one_gang_reserved_event_binds_every_rank_at_once() -> None:
    history = History("16x8:4:2")
    job = history.submit(a_job().gpus(8).tasks(6))[0]

    history.cycle()

    gangs = history.events(GangReserved, job)
    assert len(gangs) == 1
    assert sorted(r.rank for r in gangs[0].ranks) == list(range(6))
