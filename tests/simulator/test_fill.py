"""GPU-sharing traces and fill mode (DESIGN §8): the trace's sharing columns become job specs,
and `--no-departures` reports the share of GPU capacity allocated at 100% arrived demand and
the fragmentation over time."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from core.topology import parse_cluster_spec
from gangway.cli import main
from gangway.simulator.fill import run_fill
from gangway.simulator.trace import TraceError, read_trace

HEADER = (
    "job_id,submit_time,num_gpus,duration_s,tenant,"
    "gpu_fraction,mig_profile,cpus,memory_mb,gpu_type,qos"
)


def write(tmp_path: Path, *rows: str) -> Path:
    path = tmp_path / "sharing.csv"
    path.write_text("\n".join([HEADER, *rows]) + "\n")
    return path


def test_the_sharing_columns_become_job_specs(tmp_path: Path) -> None:
    trace = write(
        tmp_path,
        "share,0,1,60,nlp,0.25,,4,8192,V100M16|V100M32,LS",
        "slice,1,3,60,cv,,1g.10gb,,,H100,BE",
        "prep,2,0,60,nlp,,,8,,,",
        "whole,3,8,60,cv,1,,,,,Guaranteed",
    )
    share, slices, prep, whole = read_trace(trace)
    assert (share.spec.gpu_fraction, share.spec.sharing, share.spec.cpus_per_task) == (
        0.25,
        "mps",
        4,
    )
    assert share.spec.memory_mb_per_task == 8192
    assert share.gpu_types == ("V100M16", "V100M32") and share.spec.gpu_type == "V100M16"
    assert share.priority == "inference-critical"
    assert (slices.spec.mig_profile, slices.spec.tasks, slices.priority) == (
        "1g.10gb",
        3,
        "best-effort",
    )
    assert (prep.spec.gpus_per_task, prep.spec.cpus_per_task) == (0, 8)
    assert (whole.spec.total_gpus, whole.spec.fractional, whole.priority) == (
        8,
        False,
        "production",
    )


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ("x,0,0,60,nlp,,,,,,", "num_gpus"),
        ("x,0,1,60,nlp,,,,,,platinum", "qos"),
        ("x,0,1,60,nlp,-0.5,,,,,", "gpu_fraction"),
    ],
)
def test_bad_sharing_rows_are_one_line_errors(tmp_path: Path, row: str, message: str) -> None:
    with pytest.raises(TraceError, match=message):
        read_trace(write(tmp_path, row))


def test_fill_mode_reports_the_allocation_at_full_demand_and_fragmentation(
    tmp_path: Path,
) -> None:
    # 2 nodes x 4 GPUs = 8 GPUs; 40 quarter shares of one team arrive = 10 GPUs of demand.
    rows = [f"s{n},{n},1,60,nlp,0.25,,,,," for n in range(40)]
    out = tmp_path / "fill.json"
    code = main(
        [
            "simulate", "--trace", str(write(tmp_path, *rows)), "--cluster", "2x4",
            "--no-departures", "--json", str(out), "--no-progress",
        ]
    )  # fmt: skip
    assert code == 0
    metrics = json.loads(out.read_text())
    # Quarter shares pack perfectly: when 8 GPUs of demand have arrived, all 8 are allocated.
    assert metrics["allocated_share_at_full_demand"] == pytest.approx(1.0)
    series = metrics["fragmentation"]
    assert isinstance(series, list) and series
    assert {"time_s", "fragmentation", "arrived_demand_share", "allocated_share"} <= set(series[0])
    assert all(0.0 <= point["fragmentation"] <= 1.0 for point in series)
    assert metrics["invariant_violations"] == 0
    assert metrics["jobs"] == 32  # arrivals stop once demand reaches capacity


def test_fill_mode_re_partitions_dynamic_gpus_for_waiting_slices(tmp_path: Path) -> None:
    rows = [f"m{n},{n * 100},1,60,nlp,,3g.40gb,,,," for n in range(4)]
    jobs = read_trace(write(tmp_path, *rows))
    nodes = parse_cluster_spec(
        "groups:\n  - {count: 1, gpus: 2, gpu_type: H100, mig: dynamic, reconfigure_s: 60}\n"
    )
    result = run_fill(jobs, nodes, fill_until=10)
    # m0 waits for GPU 0 to be cut (at m1's arrival, ready 60 s later) into two 3g.40gb:
    # m0 and m1 land there at m2's arrival; m2 then waits for GPU 1, cut at m3's arrival,
    # which the trace ends before it is ready.
    assert result.geometry_changes == 2
    assert (result.placed_jobs, result.waiting_jobs) == (2, 2)
    assert result.allocated_share == pytest.approx(3 / 7)
    assert result.invariant_violations == 0


def test_soft_shares_of_two_teams_never_meet_on_a_gpu_in_fill_mode(tmp_path: Path) -> None:
    rows = [f"s{n},{n},1,60,{'ab'[n % 2]},0.5,,,,," for n in range(8)]
    jobs = read_trace(write(tmp_path, *rows))
    result = run_fill(jobs, parse_cluster_spec("1x2"), fill_until=10)
    # Two GPUs, two teams: each team gets one GPU, two halves each; the rest waits.
    assert result.placed_jobs == 4
    assert result.allocated_share == pytest.approx(1.0)


def test_a_departures_run_places_slices_and_shares_through_the_live_cycle(
    tmp_path: Path,
) -> None:
    # One H100 whose GPU the scheduler may cut: seven 1g.10gb of seven teams share it, then
    # four quarter shares of one team share a GPU; all finish and nothing breaks a rule.
    rows = [f"m{n},{n},1,600,team{n},,1g.10gb,,,," for n in range(7)]
    rows += [f"s{n},{10 + n},1,600,lab,0.25,,,,," for n in range(4)]
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(
        "groups:\n  - {count: 1, gpus: 2, gpu_type: H100, mig: dynamic, reconfigure_s: 60}\n"
    )
    out = tmp_path / "run.json"
    code = main(
        [
            "simulate", "--trace", str(write(tmp_path, *rows)), "--cluster", str(cluster),
            "--json", str(out), "--no-progress",
        ]
    )  # fmt: skip
    assert code == 0
    metrics = json.loads(out.read_text())
    assert metrics["invariant_violations"] == 0
    assert metrics["jobs"] == 11
    # Everything ran at once on two GPUs: the slices after one re-partition (60 s), the shares
    # at once; so the last job ends 600 s after the cut, not after a queue of 11 x 600 s.
    assert metrics["makespan_s"] < 2 * 600
