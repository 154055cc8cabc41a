"""The simulation loop driving the real scheduling core: known answers on tiny traces."""

from __future__ import annotations

import gc
import random
from pathlib import Path

import pytest

from gangway.simulator.engine import SimulationConfig
from gangway.simulator.metrics import SimJobMetrics
from gangway.simulator.quotas import Quota
from schemas.jobs import GangReserved, TaskExited, TaskStarted
from tests.simulator.builders import simulate, write_trace


def queue_times(records: list[SimJobMetrics]) -> dict[str, float | None]:
    return {record.job_id: record.queue_s for record in records}


def test_fifo_on_one_node_gives_queue_times_known_by_hand(tmp_path: Path) -> None:
    trace = write_trace(tmp_path, "a,0,8,100,t", "b,10,8,50,t")
    _, result = simulate(trace, "1x8", policy="fifo")
    assert queue_times(result.records) == {"a": 0.0, "b": 90.0}
    metrics = result.metrics(wall_s=0.0)
    assert metrics["avg_queue_s"] == 45.0
    assert metrics["avg_jct_s"] == (100.0 + 140.0) / 2
    assert metrics["makespan_s"] == 150.0
    assert metrics["gpu_utilization"] == pytest.approx(8 * 150 / (8 * 150))


def test_a_job_above_a_node_runs_as_a_gang_of_node_tiling_tasks(tmp_path: Path) -> None:
    simulation, _ = simulate(write_trace(tmp_path, "big,0,12,60,t"), "2x8")
    assert simulation.log is not None
    [reserved] = [event for _, event in simulation.log if isinstance(event, GangReserved)]
    assert [len(rank.gpus) for rank in reserved.ranks] == [4, 4, 4]
    started = [event for _, event in simulation.log if isinstance(event, TaskStarted)]
    exits = [(at, event) for at, event in simulation.log if isinstance(event, TaskExited)]
    assert len(started) == 3
    assert {(at, event.exit_code) for at, event in exits} == {(60.0, 0)}


def test_backfill_lowers_queue_time_behind_a_blocked_head(tmp_path: Path) -> None:
    # The 8-GPU job cannot start before the 4-GPU one ends at 1000; fifo holds the small job
    # behind it, gangway backfills it into the idle half of the node (it ends long before 1000).
    trace = write_trace(tmp_path, "long,0,4,1000,t", "head,1,8,100,t", "small,2,2,100,t")
    _, fifo = simulate(trace, "1x8", policy="fifo")
    _, gangway = simulate(trace, "1x8", policy="gangway")
    assert queue_times(fifo.records) == {"long": 0.0, "head": 999.0, "small": 1098.0}
    assert queue_times(gangway.records) == {"long": 0.0, "head": 999.0, "small": 0.0}


def test_reclaiming_a_guarantee_preempts_a_borrower_that_resumes_from_its_checkpoint(
    tmp_path: Path,
) -> None:
    trace = write_trace(tmp_path, "borrower,0,8,10000,lender", "owner,1000,8,100,keeper")
    quotas = {"lender": Quota("lender", 0, None), "keeper": Quota("keeper", 8, None)}
    _, result = simulate(trace, "1x8", quotas=quotas)
    records = {record.job_id: record for record in result.records}
    assert result.preemptions == 1
    assert result.lost_gpu_s == 0.0  # the checkpoint on request is written within the grace
    # Evicted at 1000 + 30 s of checkpoint write; the owner runs 1030-1130; the borrower then
    # does its remaining 9000 s.
    assert records["owner"].first_start_s == 1030.0
    assert records["borrower"].finish_s == 1130.0 + 9000.0
    assert records["borrower"].attempts == 2


def test_a_checkpoint_too_slow_for_the_grace_loses_the_work_since_the_last_one(
    tmp_path: Path,
) -> None:
    trace = write_trace(tmp_path, "borrower,0,8,10000,lender", "owner,1000,8,100,keeper")
    quotas = {"lender": Quota("lender", 0, None), "keeper": Quota("keeper", 8, None)}
    config = SimulationConfig(checkpoint_interval_s=600.0, checkpoint_write_s=1000.0)
    _, result = simulate(trace, "1x8", quotas=quotas, config=config)
    records = {record.job_id: record for record in result.records}
    # Grace is 120 s: evicted at 1120 without the requested checkpoint; the periodic one at
    # 600 s of run time survives, so 400 s x 8 GPUs are redone.
    assert result.lost_gpu_s == 400.0 * 8
    assert records["borrower"].finish_s == 1120.0 + 100.0 + (10000.0 - 600.0)


def test_a_small_random_trace_runs_without_invariant_violations(tmp_path: Path) -> None:
    rng = random.Random(7)
    rows = []
    for index in range(300):
        gpus = rng.choice([1, 1, 1, 2, 4, 8, 12, 16, 24, 32])
        rows.append(
            f"j{index},{rng.uniform(0, 20000):.0f},{gpus},{rng.uniform(10, 5000):.0f},"
            f"{rng.choice(['red', 'green', 'blue'])}"
        )
    trace = write_trace(tmp_path, *rows)
    quotas = {
        "red": Quota("red", 16, None),
        "green": Quota("green", 8, 32),
        "blue": Quota("blue", 8, None),
    }
    for policy in ("gangway", "fifo"):
        _, result = simulate(trace, "8x8:2:2", policy=policy, quotas=quotas)
        assert result.violations == []
        assert all(record.outcome == "succeeded" for record in result.records), policy


def test_a_job_that_ends_during_its_eviction_loses_no_work(tmp_path: Path) -> None:
    # Asked to leave at 1000, the borrower ends its work at 1010, before its checkpoint would be
    # written (1030): whatever the core then records, that work is done and not redone.
    trace = write_trace(tmp_path, "borrower,0,8,1010,lender", "owner,1000,8,100,keeper")
    quotas = {"lender": Quota("lender", 0, None), "keeper": Quota("keeper", 8, None)}
    _, result = simulate(trace, "1x8", quotas=quotas)
    records = {record.job_id: record for record in result.records}
    assert result.preemptions == 1
    assert result.lost_gpu_s == 0.0
    assert records["borrower"].outcome == "succeeded"
    assert records["owner"].first_start_s == 1010.0


@pytest.mark.parametrize("enabled", [True, False])
def test_a_run_leaves_the_garbage_collector_as_it_found_it(tmp_path: Path, enabled: bool) -> None:
    # The collector is paused while the trace is read and for the whole run (they make no
    # cyclic garbage, and its scans of the large state cost more than the work); a caller's
    # collector comes back as it was, on or off.
    trace = write_trace(tmp_path, "a,0,4,100,t", "b,10,8,50,t")
    was = gc.isenabled()
    try:
        if enabled:
            gc.enable()
        else:
            gc.disable()
        _, result = simulate(trace, "1x8")
        assert gc.isenabled() is enabled
        assert [record.outcome for record in result.records] == ["succeeded", "succeeded"]
    finally:
        if was:
            gc.enable()
        else:
            gc.disable()
