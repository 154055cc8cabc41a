"""The fifo baseline: strict arrival order, head-of-line blocking, no backfill or preemption."""

from __future__ import annotations

from core import SchedulingPolicy
from schemas.jobs import PreemptionRequested
from tests.core.builders import History, a_job


def test_fifo_blocks_small_jobs_behind_a_head_that_does_not_fit() -> None:
    history = History("2x8:2:1", policy=SchedulingPolicy(name="fifo"))
    history.submit(a_job().gpus(8))
    history.run()
    head = history.submit(a_job().gpus(8).tasks(2))[0]
    small = history.submit(a_job().gpus(1))[0]

    history.run()

    assert history.job(head).state == "queued"
    assert history.job(small).state == "queued"
    assert history.job(small).reason_code == "head_of_line"


def test_gangway_backfills_the_same_small_job() -> None:
    history = History("2x8:2:1")
    history.submit(a_job().gpus(8))
    history.run()
    history.submit(a_job().gpus(8).tasks(2))
    small = history.submit(a_job().gpus(1).estimate(60))[0]

    history.run()

    assert history.job(small).state == "running"


def test_fifo_ignores_priority_and_never_preempts() -> None:
    history = History("1x8:1:1", policy=SchedulingPolicy(name="fifo"))
    history.submit(a_job().gpus(8).priority("best-effort"))
    history.run()
    history.submit(a_job().gpus(8).priority("inference-critical"))

    history.run(cycles=3)

    assert history.events(PreemptionRequested) == []


def test_fifo_ignores_quota_ceilings() -> None:
    history = History("2x8:2:1", policy=SchedulingPolicy(name="fifo"))
    history.team("alpha", guaranteed=0, max_gpus=8)
    jobs = history.submit(a_job().gpus(8).team("alpha"), a_job().gpus(8).team("alpha"))

    history.run()

    assert [history.job(j).state for j in jobs] == ["running", "running"]
