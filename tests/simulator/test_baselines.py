"""The baselines on the same core: fifo honouring quotas, and the clairvoyant oracles."""

from __future__ import annotations

from pathlib import Path

from core import SchedulingPolicy
from gangway.simulator.baselines import Candidate, srtf_preemptions
from gangway.simulator.metrics import SimJobMetrics
from gangway.simulator.quotas import Quota
from schemas.jobs import GangReserved, JobRequeued, JobSpec, JobSucceeded, PreemptionRequested
from tests.simulator.builders import simulate, write_trace


def first_starts(records: list[SimJobMetrics]) -> dict[str, float | None]:
    return {record.job_id: record.first_start_s for record in records}


def test_two_100_s_jobs_span_100_s_and_use_a_quarter_of_a_node(tmp_path: Path) -> None:
    # The makespan ends with the last completion, not with the core's last timer (its aging
    # and estimated-end wake-ups lie hours later).
    trace = write_trace(tmp_path, "a,0,1,100,t", "b,0,1,100,t")
    _, result = simulate(trace, "1x8")
    metrics = result.metrics(wall_s=0.0)
    assert metrics["makespan_s"] == 100.0
    assert metrics["gpu_utilization"] == 2 * 100 / (8 * 100)


def test_fifo_holds_a_tenant_at_its_ceiling_and_starts_the_next_tenant(tmp_path: Path) -> None:
    # Tenant a may hold 8 GPUs: its second job waits for its first although a node is free,
    # and b's later job is not blocked behind it (a job at its ceiling is not the head).
    trace = write_trace(tmp_path, "a1,0,8,100,a", "a2,1,8,100,a", "b1,2,8,100,b")
    quotas = {"a": Quota("a", 8, 8), "b": Quota("b", 8, 8)}
    _, result = simulate(trace, "2x8", policy="fifo", quotas=quotas)
    assert first_starts(result.records) == {"a1": 0.0, "a2": 100.0, "b1": 2.0}
    assert result.violations == []


def test_fifo_keeps_arrival_order_and_blocks_behind_its_head(tmp_path: Path) -> None:
    trace = write_trace(tmp_path, "long,0,8,1000,t", "mid,1,8,500,t", "short,2,8,100,t")
    _, result = simulate(trace, "1x8", policy="fifo")
    assert first_starts(result.records) == {"long": 0.0, "mid": 1000.0, "short": 1500.0}


def test_sjf_oracle_starts_the_shortest_waiting_job_first(tmp_path: Path) -> None:
    trace = write_trace(tmp_path, "long,0,8,1000,t", "mid,1,8,500,t", "short,2,8,100,t")
    _, result = simulate(trace, "1x8", policy="sjf-oracle")
    assert first_starts(result.records) == {"long": 0.0, "short": 1000.0, "mid": 1100.0}
    assert result.preemptions == 0


def test_srtf_oracle_evicts_the_longest_remaining_work_for_a_shorter_job(tmp_path: Path) -> None:
    trace = write_trace(tmp_path, "long,0,8,10000,t", "short,1000,8,100,t")
    simulation, result = simulate(trace, "1x8", policy="srtf-oracle")
    records = {record.job_id: record for record in result.records}
    assert result.preemptions == 1
    assert simulation.log is not None
    [request] = [event for _, event in simulation.log if isinstance(event, PreemptionRequested)]
    assert (request.job_id, request.preemptor_job_id) == ("long", "short")
    [requeued] = [event for _, event in simulation.log if isinstance(event, JobRequeued)]
    assert requeued.code == "preempted"
    # The checkpoint asked for takes 30 s; short runs 1030-1130; long resumes with 9000 s left.
    assert records["short"].first_start_s == 1030.0
    assert records["long"].finish_s == 1130.0 + 9000.0
    assert result.lost_gpu_s == 0.0
    assert result.violations == []


def test_srtf_oracle_leaves_running_work_alone_when_the_newcomer_is_longer(
    tmp_path: Path,
) -> None:
    trace = write_trace(tmp_path, "first,0,8,1000,t", "longer,10,8,5000,t")
    _, result = simulate(trace, "1x8", policy="srtf-oracle")
    assert result.preemptions == 0
    assert first_starts(result.records) == {"first": 0.0, "longer": 1000.0}


def test_srtf_choice_evicts_only_what_shorter_work_displaces() -> None:
    candidates = [
        Candidate("run-long", 9000.0, 4, running=True, submit_s=0.0),
        Candidate("run-short", 50.0, 4, running=True, submit_s=0.0),
        Candidate("wait", 100.0, 4, running=False, submit_s=5.0),
    ]
    assert srtf_preemptions(candidates, capacity_gpus=8) == (["run-long"], "wait")
    assert srtf_preemptions(candidates, capacity_gpus=12) == ([], None)


def test_baselines_honour_quotas_on_a_random_trace_without_violations(tmp_path: Path) -> None:
    def tenant(index: int) -> str:
        return ["red", "blue"][index % 2]

    rows = [
        f"j{index},{index * 37 % 5000},{[1, 2, 4, 8, 16][index % 5]},"
        f"{100 + index * 53 % 3000},{tenant(index)}"
        for index in range(120)
    ]
    trace = write_trace(tmp_path, *rows)
    quotas = {"red": Quota("red", 16, 16), "blue": Quota("blue", 16, 16)}
    for policy in ("fifo", "sjf-oracle", "srtf-oracle"):
        simulation, result = simulate(trace, "4x8:2:2", policy=policy, quotas=quotas)
        assert result.violations == [], policy
        assert all(record.outcome == "succeeded" for record in result.records), policy
        assert simulation.log is not None
        held = {"red": 0, "blue": 0}
        for _, event in simulation.log:
            if isinstance(event, GangReserved):
                job = int(event.job_id[1:])
                held[tenant(job)] += sum(len(rank.gpus) for rank in event.ranks)
                assert held[tenant(job)] <= 16, policy
            elif isinstance(event, JobSucceeded | JobRequeued):
                job = int(event.job_id[1:])
                held[tenant(job)] -= [1, 2, 4, 8, 16][job % 5]


def test_no_true_runtime_reaches_the_core() -> None:
    # The oracles' knowledge stays in the simulator: nothing in core/ (nor the job spec it
    # reads) names the trace's duration, and Gangway's own policy takes no caller ordering.
    root = Path(__file__).resolve().parents[2]
    for source in sorted((root / "core").glob("*.py")):
        assert "duration_s" not in source.read_text(encoding="utf-8"), source.name
    assert "duration_s" not in JobSpec.model_fields
    assert SchedulingPolicy().order_key is None
