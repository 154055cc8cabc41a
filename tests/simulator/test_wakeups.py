"""The simulator's cycles: one for each moment where something happened, plus the one wake-up
the last cycle asked for (as the scheduler service keeps only its last cycle's `next_wakeup`)."""

from __future__ import annotations

import math
from pathlib import Path

from core import SchedulingPolicy
from gangway.simulator.quotas import Quota
from tests.simulator.builders import simulate, write_trace

HEADER = "job_id,submit_time,num_gpus,duration_s,tenant,estimated_runtime_s"


def test_a_gang_past_its_estimate_does_not_multiply_the_quiet_cycles(tmp_path: Path) -> None:
    # One gang runs 3,000 s on a 60 s estimate: from then on each cycle asks for a wake-up
    # `overrun_grace_s` later (its end may come at any moment). Fifty short jobs arrive beside
    # it, each giving a cycle at its arrival and at its end. Were every cycle's wake-up kept,
    # each of those hundred cycles would start its own chain of wake-ups every 300 s until the
    # gang ends (hundreds of cycles deciding nothing); only the last cycle's counts.
    rows = ["long,0,8,3000,t,60"]
    rows += [f"s{index},{100 + index * 20},1,5,t,60" for index in range(50)]
    simulation, result = simulate(write_trace(tmp_path, *rows, header=HEADER), "2x8")
    assert simulation.log is not None
    moments = {at for at, _ in simulation.log}
    grace = SchedulingPolicy().overrun_grace_s
    assert result.cycles <= len(moments) + math.ceil(3000 / grace) + 1
    assert all(record.outcome == "succeeded" for record in result.records)
    assert result.violations == []


def test_a_wake_up_asked_for_by_the_last_cycle_still_comes(tmp_path: Path) -> None:
    # The short job arrives while its tenant's guarantee is full, 300 s after the long gang
    # started: its 2,400 GPU-seconds are still on the lowest level, the short job's, so
    # fairness cannot evict it yet. It reaches the next level (3,600 GPU-seconds) at 450 s and
    # is worth evicting (gain twice the cost of its checkpoint) at 960 s: moments the cycle
    # asks to be woken at. No event comes between 300 s and the gang's estimated end
    # (14,400 s), so only those wake-ups can evict it early.
    trace = write_trace(
        tmp_path, "long,0,8,100000,red,14400", "short,300,1,600,red,14400", header=HEADER
    )
    _, result = simulate(trace, "2x8", quotas={"red": Quota("red", 8, 8)})
    short = next(record for record in result.records if record.job_id == "short")
    assert result.preemptions == 1
    assert short.first_start_s == 960 + 30  # eligible at 960 s, then its checkpoint write


def test_a_flood_past_the_cycles_bound_is_considered_at_the_same_moment(tmp_path: Path) -> None:
    # Four jobs arrive at once and a cycle considers one newly queued job: the next cycles
    # follow at once (as the service runs them), so all four start at their arrival, not at
    # the next event (the first one's end, 100 s on).
    rows = [f"j{index},0,1,100,t,100" for index in range(4)]
    _, result = simulate(
        write_trace(tmp_path, *rows, header=HEADER),
        "1x8",
        scheduling=SchedulingPolicy(max_new_jobs_per_cycle=1),
    )
    assert [record.first_start_s for record in result.records] == [0, 0, 0, 0]
    assert result.cycles >= 4
    assert result.violations == []
