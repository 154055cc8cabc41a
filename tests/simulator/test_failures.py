"""Injected node and GPU failures: whole-gang requeues, resumption from the last checkpoint."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from gangway.simulator.engine import AUTO, SimulationConfig
from gangway.simulator.failures import HOUR_S, FailureConfig, young_daly_interval
from schemas.jobs import GangReserved, JobRequeued
from schemas.nodes import GpuRecovered, GpuUnhealthy, NodeLost, NodeRecovered
from tests.simulator.builders import simulate, write_trace


def failing(
    *, mtbf_h: float | None = None, xid: float = 0.0, seed: int = 0, interval: float | str = 1800.0
) -> SimulationConfig:
    return SimulationConfig(
        checkpoint_interval_s=interval,  # type: ignore[arg-type]
        checkpoint_write_s=30.0,
        failures=FailureConfig(node_mtbf_h=mtbf_h, gpu_xid_rate=xid, seed=seed),
    )


def test_young_daly_interval_is_sqrt_2_c_mtbf() -> None:
    mtbf_s = 1000 * HOUR_S
    assert young_daly_interval(30.0, 1 / mtbf_s) == pytest.approx(math.sqrt(2 * 30.0 * mtbf_s))
    assert young_daly_interval(30.0, 0.0) == math.inf
    # A gang on 16 nodes fails 16 times as often: its interval is 4 times shorter.
    config = FailureConfig(node_mtbf_h=1000)
    one = young_daly_interval(30.0, config.gang_failure_rate(1, 8))
    sixteen = young_daly_interval(30.0, config.gang_failure_rate(16, 128))
    assert one / sixteen == pytest.approx(4.0)


def test_a_lost_node_requeues_its_gang_which_resumes_from_its_last_checkpoint(
    tmp_path: Path,
) -> None:
    trace = write_trace(tmp_path, "long,0,8,200000,t")
    simulation, result = simulate(trace, "2x8", config=failing(mtbf_h=20, seed=3))
    assert simulation.log is not None
    log = simulation.log
    lost = [(at, event) for at, event in log if isinstance(event, NodeLost)]
    assert lost and len(lost) == result.node_failures
    assert any(isinstance(event, NodeRecovered) for _, event in log)
    requeues = [(at, event) for at, event in log if isinstance(event, JobRequeued)]
    assert requeues and {event.code for _, event in requeues} == {"node_lost"}
    # The gang restarts at once on the node that is still up, not when the lost one is back.
    restarts = [at for at, event in log if isinstance(event, GangReserved)][1:]
    assert restarts[0] == requeues[0][0]
    [record] = result.records
    assert record.outcome == "succeeded"
    assert record.attempts == len(requeues) + 1
    # The first failure under the gang: the work since the last periodic checkpoint (every
    # 1800 s of work, each taking 30 s to write) is redone.
    first_start = next(at for at, event in log if isinstance(event, GangReserved))
    failed_at, _ = requeues[0]
    elapsed = failed_at - first_start
    into_period = elapsed % (1800 + 30)
    first_rework = 8 * min(into_period, 1800)
    assert result.failure_rework_gpu_s >= first_rework
    assert result.lost_gpu_s == 0.0  # nothing was preempted
    assert result.lost_gpu_s_failures == pytest.approx(
        result.failure_rework_gpu_s + result.checkpoint_write_gpu_s
    )
    assert result.violations == []


def test_a_faulty_gpu_requeues_the_gang_on_it(tmp_path: Path) -> None:
    trace = write_trace(tmp_path, "gang,0,16,100000,t")
    simulation, result = simulate(trace, "2x8", config=failing(xid=0.002, seed=1))
    assert simulation.log is not None
    assert result.gpu_failures > 0
    assert any(isinstance(event, GpuUnhealthy) for _, event in simulation.log)
    assert any(isinstance(event, GpuRecovered) for _, event in simulation.log)
    codes = {event.code for _, event in simulation.log if isinstance(event, JobRequeued)}
    assert codes == {"gpu_unhealthy"}
    assert result.records[0].outcome == "succeeded"
    assert result.failure_rework_gpu_s > 0
    assert result.violations == []


def test_the_same_trace_and_seed_give_the_same_decisions(tmp_path: Path) -> None:
    rows = [
        f"j{index},{index * 311 % 40000},{[1, 2, 4, 8, 16][index % 5]},"
        f"{600 + index * 977 % 30000},{['red', 'blue'][index % 2]}"
        for index in range(80)
    ]
    trace = write_trace(tmp_path, *rows)
    config = failing(mtbf_h=30, xid=0.001, seed=11)
    first, _ = simulate(trace, "4x8:2:2", config=config)
    again, _ = simulate(trace, "4x8:2:2", config=config)
    other, _ = simulate(trace, "4x8:2:2", config=failing(mtbf_h=30, xid=0.001, seed=12))
    assert first.log is not None and again.log is not None and other.log is not None
    assert first.log == again.log
    assert first.log != other.log


def test_adaptive_intervals_lose_less_than_a_fixed_30_minutes_when_failures_are_rare(
    tmp_path: Path,
) -> None:
    # Node MTBF 1,000 h: a one-node job's Young-Daly interval is about 4 h, so it writes far
    # fewer checkpoints than every 30 min, and the rework it risks is small beside that.
    trace = write_trace(tmp_path, "a,0,8,2000000,t", "b,0,8,2000000,t")
    _, fixed = simulate(trace, "4x8", config=failing(mtbf_h=1000, seed=5, interval=1800.0))
    _, auto = simulate(trace, "4x8", config=failing(mtbf_h=1000, seed=5, interval=AUTO))
    assert fixed.node_failures > 0
    assert auto.lost_gpu_s_failures < fixed.lost_gpu_s_failures
    assert auto.checkpoint_write_gpu_s < fixed.checkpoint_write_gpu_s


def test_without_failures_periodic_checkpoints_cost_nothing(tmp_path: Path) -> None:
    trace = write_trace(tmp_path, "a,0,8,10000,t")
    _, result = simulate(trace, "1x8")
    assert result.records[0].finish_s == 10000.0
    assert result.lost_gpu_s_failures == 0.0
    assert result.node_failures == result.gpu_failures == 0


def test_an_auto_interval_needs_a_checkpoint_cost() -> None:
    with pytest.raises(ValueError, match="auto"):
        SimulationConfig(checkpoint_interval_s=AUTO, checkpoint_write_s=0.0)
    with pytest.raises(ValueError, match="MTBF"):
        FailureConfig(node_mtbf_h=0)
