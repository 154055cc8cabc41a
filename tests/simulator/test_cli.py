"""`gangway simulate` end to end: flags, JSON keys, plot, and exit 2 with one line on bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gangway.cli import main
from tests.simulator.builders import write_trace

GANGWAY = Path(sys.executable).parent / "gangway"
CONTRACT_KEYS = {
    "jobs", "completed", "avg_jct_s", "avg_queue_s", "p50_queue_s", "p99_queue_s",
    "max_queue_s", "avg_queue_gt8_s", "gpu_utilization", "makespan_s", "preemptions",
    "lost_gpu_s", "invariant_violations", "per_tenant", "per_priority", "wall_s",
}  # fmt: skip
GROUP_KEYS = {"jobs", "completed", "avg_queue_s", "p50_queue_s", "p99_queue_s", "avg_jct_s"}


def small_trace(tmp_path: Path) -> Path:
    return write_trace(
        tmp_path,
        "a,2017-10-01 00:00:00,8,100,red",
        "b,2017-10-01 00:00:10,16,50,blue",
        "c,2017-10-01 00:00:20,1,30,red",
        "d,2017-10-02 00:00:00,1,30,red",
    )


@pytest.mark.skipif(not GANGWAY.exists(), reason="the gangway console script is not installed")
def test_the_installed_command_runs_a_trace_and_writes_the_contract_json(tmp_path: Path) -> None:
    out = tmp_path / "metrics.json"
    done = subprocess.run(
        [
            str(GANGWAY), "simulate", "--trace", str(small_trace(tmp_path)), "--cluster", "2x8",
            "--start", "2017-10-01", "--end", "2017-10-01", "--policy", "fifo",
            "--json", str(out), "--no-progress",
        ],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    metrics = json.loads(out.read_text())
    assert set(metrics) >= CONTRACT_KEYS
    assert metrics["jobs"] == 3  # d is past the window
    assert metrics["completed"] == 3
    assert metrics["invariant_violations"] == 0
    assert set(metrics["per_tenant"]) == {"red", "blue"}
    assert all(set(group) >= GROUP_KEYS for group in metrics["per_tenant"].values())
    assert set(metrics["per_priority"]) == {"research"}
    assert "average queue time" in done.stdout


@pytest.mark.skipif(not GANGWAY.exists(), reason="the gangway console script is not installed")
def test_the_installed_command_exits_2_with_one_line_on_a_missing_trace(tmp_path: Path) -> None:
    done = subprocess.run(
        [str(GANGWAY), "simulate", "--trace", str(tmp_path / "absent.csv"), "--cluster", "2x8"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1
    assert "absent.csv" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("rows", "extra", "message"),
    [
        (("submit_time,duration_s", "0,5"), [], "missing column(s) num_gpus"),
        (("submit_time,num_gpus,duration_s", "0,x,5"), [], "num_gpus 'x' is not a whole number"),
        (("submit_time,num_gpus,duration_s", "0,1,5"), ["--cluster", "8y8"], "--cluster 8y8"),
        (("submit_time,num_gpus,duration_s", "0,1,5"), ["--start", "soon"], "--start/--end"),
        (("submit_time,num_gpus,duration_s", "0,1,5"), ["--quotas", "/nonexistent.csv"], "quotas"),
        (
            ("submit_time,num_gpus,duration_s", "0,1,5"),
            ["--checkpoint-interval", "often"],
            "--checkpoint-interval must be a number of seconds or auto",
        ),
        (
            ("submit_time,num_gpus,duration_s", "0,1,5"),
            ["--checkpoint-interval", "auto", "--checkpoint-write", "0"],
            "'auto' checkpoint interval needs a checkpoint write time",
        ),
        (("submit_time,num_gpus,duration_s", "0,1,5"), ["--node-mtbf-h", "-1"], "MTBF"),
    ],
)
def test_bad_input_exits_2_with_one_line(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    rows: tuple[str, ...],
    extra: list[str],
    message: str,
) -> None:
    trace = tmp_path / "trace.csv"
    trace.write_text("\n".join(rows) + "\n")
    args = ["simulate", "--trace", str(trace), "--cluster", "1x8", "--no-progress", *extra]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert message in err
    assert err.count("\n") == 1


def test_plot_writes_a_png(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plot = tmp_path / "run.png"
    args = ["simulate", "--trace", str(small_trace(tmp_path)), "--cluster", "2x8", "--no-progress"]
    assert main([*args, "--plot", str(plot)]) == 0
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_quotas_leave_out_tenants_they_do_not_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    quotas = tmp_path / "quotas.csv"
    quotas.write_text("tenant,guaranteed_gpus,max_gpus\nred,8,16\n")
    out = tmp_path / "m.json"
    args = ["simulate", "--trace", str(small_trace(tmp_path)), "--cluster", "2x8", "--no-progress"]
    assert main([*args, "--quotas", str(quotas), "--json", str(out)]) == 0
    metrics = json.loads(out.read_text())
    assert (metrics["jobs"], metrics["skipped_jobs"]) == (3, 1)
    assert "left out: blue" in capsys.readouterr().err


def test_guarantees_beyond_the_cluster_are_refused_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Invariant 4 promises each team its whole guarantee: guarantees the cluster cannot hold
    all at once are bad input, refused before the run (the auditor would otherwise flag the
    scheduler). Only the trace's tenants count: green has no job."""
    quotas = tmp_path / "quotas.csv"
    quotas.write_text("tenant,guaranteed_gpus,max_gpus\nred,8,\nblue,16,\ngreen,64,\n")
    args = ["simulate", "--trace", str(small_trace(tmp_path)), "--cluster", "2x8", "--no-progress"]
    assert main([*args, "--quotas", str(quotas)]) == 2
    err = capsys.readouterr().err
    assert "the guarantees of the trace's tenants total 24 GPUs, more than the cluster's 16" in err
    assert err.count("\n") == 1
    # As many GPUs guaranteed as the cluster has: every guarantee can be honoured at once.
    assert main([*args, "--cluster", "3x8", "--quotas", str(quotas)]) == 0
    capsys.readouterr()


def test_cluster_may_be_a_yaml_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text("groups:\n  - count: 2\n    gpus: 8\n")
    out = tmp_path / "m.json"
    args = ["simulate", "--trace", str(small_trace(tmp_path)), "--cluster", str(cluster)]
    assert main([*args, "--no-progress", "--json", str(out)]) == 0
    metrics = json.loads(out.read_text())
    assert (metrics["capacity_gpus"], metrics["completed"]) == (16, 4)


@pytest.mark.parametrize("policy", ["gangway", "fifo", "sjf-oracle", "srtf-oracle"])
def test_every_policy_runs_on_the_same_trace_and_quotas(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], policy: str
) -> None:
    quotas = tmp_path / "quotas.csv"
    quotas.write_text("tenant,guaranteed_gpus,max_gpus\nred,8,8\nblue,8,16\n")
    out = tmp_path / "m.json"
    args = ["simulate", "--trace", str(small_trace(tmp_path)), "--cluster", "2x8", "--no-progress"]
    assert main([*args, "--policy", policy, "--quotas", str(quotas), "--json", str(out)]) == 0
    metrics = json.loads(out.read_text())
    assert metrics["policy"] == policy
    assert metrics["completed"] == 4
    assert metrics["invariant_violations"] == 0
    # The last job (d, 30 s) ends a day after the first submission: the makespan stops there.
    assert metrics["makespan_s"] == 86400.0 + 30.0


def test_injected_failures_report_their_lost_gpu_seconds_apart_from_preemption(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = write_trace(tmp_path, "long,0,8,800000,red", "other,10,8,800000,blue")
    args = ["simulate", "--trace", str(trace), "--cluster", "3x8", "--no-progress"]
    runs = []
    for interval in ("1800", "auto"):
        out = tmp_path / f"m-{interval}.json"
        flags = ["--node-mtbf-h", "200", "--gpu-xid-rate", "0.0001", "--seed", "4"]
        assert main([*args, *flags, "--checkpoint-interval", interval, "--json", str(out)]) == 0
        runs.append(json.loads(out.read_text()))
    fixed, auto = runs
    for metrics in runs:
        assert set(metrics) >= CONTRACT_KEYS | {"lost_gpu_s_failures"}
        assert metrics["lost_gpu_s"] == 0.0
        assert metrics["lost_gpu_s_failures"] > 0.0
        assert metrics["completed"] == 2
    assert (fixed["node_failures"], fixed["gpu_failures"]) == (
        auto["node_failures"],
        auto["gpu_failures"],
    )  # the same seed draws the same failures
    assert fixed["node_failures"] + fixed["gpu_failures"] > 0
    assert auto["checkpoint_interval"] == "auto"
    # Failures are rare here (a gang's MTBF ~ 170 h): Young-Daly checkpoints every ~1.7 h,
    # saving far more writing than the longer rework it risks.
    assert auto["lost_gpu_s_failures"] < fixed["lost_gpu_s_failures"]
