"""Predicted-short first goes by what the scheduler learned (core/ordering.py:length_level with
core/estimates.py): within a team's guarantee, a job that gives no estimate is predicted by
what jobs like it ran, so the next of a family of short jobs goes before an older job of a
family that ran for hours."""

from __future__ import annotations

from core import SchedulingPolicy
from tests.core.builders import History, a_job

# No fairness evictions: only the order of the waiting jobs decides who takes the node.
POLICY = SchedulingPolicy(fairness_preemption=False)


def test_a_job_whose_kind_ran_short_goes_before_an_older_one_whose_kind_ran_for_hours() -> None:
    history = History("1x8:1:1", policy=POLICY).team("alpha", guaranteed=8, max_gpus=8)
    # Three runs of each family, side by side, none with an estimate: prep ran 2 minutes,
    # train 2 hours.
    for n in (1, 2, 3):
        history.submit(a_job(f"prep-{n}").gpus(1).team("alpha"))
        history.submit(a_job(f"train-{n}").gpus(1).team("alpha"))
    history.run()
    history.advance(120)
    for n in (1, 2, 3):
        history.exit(f"prep-{n}", 0)
    history.run()
    history.advance(7080)
    for n in (1, 2, 3):
        history.exit(f"train-{n}", 0)
    history.run()
    busy = history.submit(a_job("hold").gpus(8).team("alpha").estimate(600))[0]
    history.run()
    older = history.submit(a_job("train-4").gpus(8).team("alpha"))[0]
    history.advance(60)
    newer = history.submit(a_job("prep-4").gpus(8).team("alpha"))[0]
    history.run()
    history.exit(busy, 0)

    history.run(cycles=2)

    assert history.job(newer).state == "running"  # predicted 2 minutes: under 15
    assert history.job(older).state == "queued"  # predicted 2 hours
    assert history.auditor.violations == []
