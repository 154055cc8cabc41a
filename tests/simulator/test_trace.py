"""Reading job traces: time formats, tenants, gang shapes, and one-line errors on bad input."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from gangway.simulator.trace import TraceError, gang_shape, parse_time, read_trace

# shared/ stands beside the checkout (DESIGN: ../shared/traces).
PHILLY = Path(__file__).resolve().parents[3] / "shared" / "traces" / "philly_sia_jobs.csv"


def write(tmp_path: Path, text: str, name: str = "trace.csv") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_iso_submit_times_are_utc_seconds(tmp_path: Path) -> None:
    trace = write(tmp_path, "submit_time,num_gpus,duration_s\n2017-10-01 00:00:10,1,60\n")
    [job] = read_trace(trace)
    assert job.submit_s == datetime(2017, 10, 1, 0, 0, 10, tzinfo=UTC).timestamp()


def test_numeric_submit_times_are_seconds(tmp_path: Path) -> None:
    trace = write(tmp_path, "submit_time,num_gpus,duration_s\n120.5,2,60\n0,1,30\n")
    jobs = read_trace(trace)
    assert [job.submit_s for job in jobs] == [0.0, 120.5]  # sorted by submit time


def test_vc_column_is_the_tenant(tmp_path: Path) -> None:
    trace = write(tmp_path, "job_id,submit_time,num_gpus,duration_s,vc\n7,0,1,60,6214e9\n")
    [job] = read_trace(trace)
    assert (job.job_id, job.tenant, job.spec.team, job.spec.queue) == (
        "7",
        "6214e9",
        "6214e9",
        "6214e9",
    )


def test_unknown_columns_are_ignored(tmp_path: Path) -> None:
    trace = write(tmp_path, "submit_time,colour,num_gpus,duration_s,gpu_time_s\n0,red,4,60,240\n")
    [job] = read_trace(trace)
    assert (job.num_gpus, job.duration_s, job.tenant, job.priority) == (
        4,
        60.0,
        "default",
        "research",
    )


def test_optional_columns_reach_the_spec(tmp_path: Path) -> None:
    trace = write(
        tmp_path,
        "submit_time,num_gpus,duration_s,priority,gpus_per_task,tp_size,estimated_runtime_s,preemptible\n"
        "0,16,600,production,4,4,900,false\n",
    )
    [job] = read_trace(trace)
    spec = job.spec
    assert (spec.priority, spec.tasks, spec.gpus_per_task, spec.topology.tp_size) == (
        "production",
        4,
        4,
        4,
    )
    assert (spec.estimated_runtime_s, spec.preemptible) == (900.0, False)


def test_runtime_estimate_defaults_to_the_duration(tmp_path: Path) -> None:
    [job] = read_trace(write(tmp_path, "submit_time,num_gpus,duration_s\n0,1,3600\n"))
    assert job.spec.estimated_runtime_s == 3600.0


@pytest.mark.parametrize(
    ("gpus", "shape"),
    [
        (1, (1, 1)),
        (8, (1, 8)),
        (12, (3, 4)),
        (16, (2, 8)),
        (24, (3, 8)),
        (128, (16, 8)),
        (9, (9, 1)),
    ],
)
def test_jobs_above_a_node_become_gangs_of_node_tiling_tasks(
    gpus: int, shape: tuple[int, int]
) -> None:
    assert gang_shape(gpus, 8) == shape


def test_window_keeps_jobs_from_start_up_to_the_end_of_a_bare_end_date(tmp_path: Path) -> None:
    trace = write(
        tmp_path,
        "submit_time,num_gpus,duration_s\n"
        "2017-09-30 23:59:59,1,1\n2017-10-01 00:00:00,1,1\n"
        "2017-10-02 23:59:59,1,1\n2017-10-03 00:00:00,1,1\n",
    )
    jobs = read_trace(
        trace, start_s=parse_time("2017-10-01"), end_s=parse_time("2017-10-02", end_of_day=True)
    )
    assert len(jobs) == 2


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("num_gpus,duration_s\n1,60\n", "missing column(s) submit_time"),
        (
            "submit_time,num_gpus,duration_s\n0,two,60\n",
            "line 2: num_gpus 'two' is not a whole number",
        ),
        ("submit_time,num_gpus,duration_s\n0,1,-5\n", "line 2: duration_s '-5' must be"),
        ("submit_time,num_gpus,duration_s\nyesterday,1,5\n", "line 2: submit_time"),
        ("submit_time,num_gpus,duration_s\n0,1.5,5\n", "num_gpus '1.5' must be a whole number"),
        ("submit_time,num_gpus,duration_s\n0,12,5,\n0,12\n", "line 3: expected 3 fields"),
        ("job_id,submit_time,num_gpus,duration_s\na,0,1,5\na,1,1,5\n", "job_id 'a' appears twice"),
        ("", "empty"),
    ],
)
def test_bad_input_is_one_line_naming_the_problem(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(TraceError) as caught:
        read_trace(write(tmp_path, text))
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


def test_missing_file_is_a_trace_error(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="cannot read trace"):
        read_trace(tmp_path / "absent.csv")


@pytest.mark.skipif(not PHILLY.exists(), reason="the shared Philly trace is not here")
def test_the_philly_window_reads_as_it_is() -> None:
    jobs = read_trace(
        PHILLY, start_s=parse_time("2017-10-01"), end_s=parse_time("2017-11-30", end_of_day=True)
    )
    assert len(jobs) == 68_510  # 68,503 in the 11 VCs with a node count, 7 in four small ones
    assert {job.spec.gpus_per_task for job in jobs if job.num_gpus == 12} == {4}
