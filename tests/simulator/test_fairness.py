"""Preemption for fairness in the simulator: the same core, evicting for attained service,
without a true runtime (every job's estimate is the same 4 h), deterministic and audited."""

from __future__ import annotations

from pathlib import Path

from core import SchedulingPolicy
from gangway.simulator.quotas import Quota
from schemas.jobs import PreemptionRequested
from tests.simulator.builders import simulate, write_trace

FAIR = SchedulingPolicy(fairness_preemption=True)
PLAIN = SchedulingPolicy(fairness_preemption=False)
HEADER = "job_id,submit_time,num_gpus,duration_s,tenant,estimated_runtime_s"
QUOTAS = {"red": Quota("red", 16, 16), "blue": Quota("blue", 16, 16)}


def _trace(tmp_path: Path) -> Path:
    rows = [
        f"j{index},{index * 97 % 20000},{[1, 2, 4, 8, 16][index % 5]},"
        f"{[300, 900, 40000, 2000, 60000][index * 7 % 5]},{['red', 'blue'][index % 2]},14400"
        for index in range(90)
    ]
    return write_trace(tmp_path, *rows, header=HEADER)


def test_a_short_job_overtakes_a_long_one_of_its_tenant_in_simulated_time(tmp_path: Path) -> None:
    trace = write_trace(
        tmp_path, "long,0,8,100000,red,14400", "short,7200,1,600,red,14400", header=HEADER
    )
    quotas = {"red": Quota("red", 8, 8)}
    _, fair = simulate(trace, "2x8", quotas=quotas, scheduling=FAIR)
    _, plain = simulate(trace, "2x8", quotas=quotas, scheduling=PLAIN)
    short_fair = next(r for r in fair.records if r.job_id == "short")
    short_plain = next(r for r in plain.records if r.job_id == "short")
    assert short_fair.queue_s is not None and short_fair.queue_s < 200  # the write, the grace
    assert short_plain.queue_s == 100000 - 7200  # behind the long job
    assert all(record.outcome == "succeeded" for record in fair.records)
    assert fair.preemptions == 1 and fair.lost_gpu_s == 0.0
    assert fair.violations == []


def test_fairness_evictions_keep_every_invariant_and_finish_every_job(tmp_path: Path) -> None:
    simulation, result = simulate(_trace(tmp_path), "4x8:2:2", quotas=QUOTAS, scheduling=FAIR)
    assert simulation.log is not None
    codes = {event.code for _, event in simulation.log if isinstance(event, PreemptionRequested)}
    assert codes == {"fairness"}
    assert result.violations == []
    assert all(record.outcome == "succeeded" for record in result.records)


def test_the_same_trace_gives_the_same_fairness_decisions(tmp_path: Path) -> None:
    trace = _trace(tmp_path)
    first, _ = simulate(trace, "4x8:2:2", quotas=QUOTAS, scheduling=FAIR)
    again, _ = simulate(trace, "4x8:2:2", quotas=QUOTAS, scheduling=FAIR)
    plain, _ = simulate(trace, "4x8:2:2", quotas=QUOTAS, scheduling=PLAIN)
    assert first.log is not None and again.log is not None and plain.log is not None
    assert first.log == again.log
    assert first.log != plain.log
