"""gangway logs / usage / jobs (listing) / top, against a real API server on the real log."""

from __future__ import annotations

import asyncio
import csv
import io
import json
import os
import sys
import time
from pathlib import Path

import httpx
import pytest

from gangway.cli import main
from gangway.commands import jobs as jobs_command
from schemas.jobs import JobAdmitted, JobSucceeded, TaskStarted
from services.agent import logs
from services.runtime import EventStore, Settings
from tests.api.builders import node, reserved
from tests.cli.test_api_commands import submit

pytestmark = pytest.mark.integration


def start(settings: Settings, job_id: str, *, finish: bool = False, register: bool = False) -> None:
    """Record what the scheduler and the agent would: admitted, reserved, both ranks started."""
    events = [
        JobAdmitted(job_id=job_id, queue="nlp", priority="production"),
        reserved(job_id, [("n1", [0, 1, 2, 3]), ("n1", [4, 5, 6, 7])]),
        TaskStarted(job_id=job_id, attempt=1, rank=0, node_id="n1"),
        TaskStarted(job_id=job_id, attempt=1, rank=1, node_id="n1"),
    ]
    if finish:
        events.append(JobSucceeded(job_id=job_id, attempt=1))

    async def append() -> None:
        store = await EventStore.connect(settings)
        try:
            if register:
                await store.append("node-n1", 0, [node("n1")])
            await store.append(f"job-{job_id}", 1, events)
        finally:
            await store.close()

    asyncio.run(append())
    # The API learns of events written behind its back by polling the log: wait until it has.
    expected = "succeeded" if finish else "running"
    headers = {"Authorization": f"Bearer {os.environ['GANGWAY_TOKEN']}"}
    deadline = time.monotonic() + 30
    while True:
        response = httpx.get(f"{os.environ['GANGWAY_API_URL']}/v1/jobs/{job_id}", headers=headers)
        if response.status_code == 200 and response.json()["state"] == expected:
            return
        assert time.monotonic() < deadline, f"the API never saw {job_id} {expected}"
        time.sleep(0.05)


def test_logs_prints_a_ranks_output_and_its_tail(
    api_url: str, settings: Settings, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job_id = submit(tmp_path, capsys)
    start(settings, job_id, finish=True)
    for rank in (0, 1):
        path = logs.rank_log(tmp_path / "agent", job_id, 1, rank).path
        path.parent.mkdir(parents=True)
        path.write_text("".join(f"rank {rank} step {i}\n" for i in range(10)))
    assert main(["logs", job_id]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "rank 0 step 9"
    assert main(["logs", job_id, "--rank", "1", "--tail", "2"]) == 0
    assert capsys.readouterr().out == "rank 1 step 8\nrank 1 step 9\n"
    # Following a finished job prints what there is and ends.
    assert main(["logs", job_id, "-f", "--tail", "1"]) == 0
    assert capsys.readouterr().out == "rank 0 step 9\n"
    assert main(["logs", job_id, "--attempt", "2"]) == 1
    assert capsys.readouterr().err == (
        f"gangway: job {job_id} has no attempt 2: it has had 1 attempt\n"
    )


def test_logs_spells_out_a_ranks_escape_sequences_on_a_terminal_only(
    api_url: str,
    settings: Settings,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    job_id = submit(tmp_path, capsys)
    start(settings, job_id, finish=True)
    path = logs.rank_log(tmp_path / "agent", job_id, 1, 0).path
    path.parent.mkdir(parents=True)
    path.write_bytes(b"\x1b]0;retitled\x07\x1b[2Jstep\t1\rhidden\n")
    # Piped or redirected: byte for byte, as the rank wrote it.
    assert main(["logs", job_id]) == 0
    assert capsys.readouterr().out == "\x1b]0;retitled\x07\x1b[2Jstep\t1\rhidden\n"
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    assert main(["logs", job_id]) == 0
    assert capsys.readouterr().out == "\\x1b]0;retitled\\x07\\x1b[2Jstep\t1\\x0dhidden\n"
    assert main(["logs", job_id, "--raw"]) == 0
    assert capsys.readouterr().out == "\x1b]0;retitled\x07\x1b[2Jstep\t1\rhidden\n"


def test_usage_prints_a_table_and_csv_for_finance(
    api_url: str, settings: Settings, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job_id = submit(tmp_path, capsys)
    start(settings, job_id)  # running: its hours count up to now
    assert main(["usage"]) == 0
    out = capsys.readouterr().out
    assert "ALLOCATED GPU-H" in out and "nlp" in out
    assert main(["usage", "--csv", "--by", "week"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    [row] = rows
    assert row["team"] == "nlp"
    assert float(row["allocated_gpu_hours"]) >= float(row["used_gpu_hours"]) >= 0
    assert main(["usage", "--from", "2026-01-02", "--to", "2026-01-01"]) == 1
    assert "before" in capsys.readouterr().err


def test_jobs_lists_active_jobs_newest_first_and_all_with_all(
    api_url: str,
    settings: Settings,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    first, second, third = (submit(tmp_path, capsys) for _ in range(3))
    start(settings, first, finish=True)
    # Pages of two: every page is read, nothing falls off the end.
    monkeypatch.setattr(jobs_command, "PAGE", 2)

    assert main(["jobs", "-o", "json"]) == 0
    assert [job["id"] for job in json.loads(capsys.readouterr().out)] == [third, second]
    assert main(["jobs", "--all", "-o", "json"]) == 0
    assert [job["id"] for job in json.loads(capsys.readouterr().out)] == [third, second, first]
    assert main(["jobs", "--state", "succeeded", "-o", "json"]) == 0
    assert [job["id"] for job in json.loads(capsys.readouterr().out)] == [first]
    assert main(["jobs", "--team", "vision", "-o", "json"]) == 0
    assert json.loads(capsys.readouterr().out) == []

    assert main(["jobs", "-o", "wide"]) == 0
    out = capsys.readouterr().out
    assert "ATTEMPTS" in out and third in out and first not in out
    assert out.index(third) < out.index(second)


def test_top_draws_the_cluster_the_teams_and_the_queue(
    api_url: str, settings: Settings, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    running, waiting = submit(tmp_path, capsys), submit(tmp_path, capsys)
    start(settings, running, register=True)
    assert main(["top", "--once"]) == 0
    out = capsys.readouterr().out
    assert "Top teams" in out and "nlp" in out
    assert running in out and waiting in out
    assert "8/8 allocated" in out  # the one node's 8 GPUs, held by the running gang


def test_top_and_jobs_watch_print_plain_snapshots_when_piped(
    api_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job_id = submit(tmp_path, capsys)
    # Captured output is no terminal: no live redraw (which printed nothing), but a snapshot
    # after the other, each in full.
    assert main(["top", "-n", "2", "--interval", "0.01"]) == 0
    out = capsys.readouterr().out
    assert out.count("gangway top") == 2 and out.count("Top teams") == 2
    assert out.count(job_id) == 2
    assert "\x1b[" not in out  # plain text, no terminal control sequences
    assert main(["jobs", "--watch", "-n", "3", "--interval", "0.01"]) == 0
    out = capsys.readouterr().out
    assert out.count("every 0.01s") == 3 and out.count(job_id) == 3


def test_job_shows_the_command_elapsed_time_and_where_the_logs_are(
    api_url: str, settings: Settings, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job_id = submit(tmp_path, capsys)
    start(settings, job_id)
    assert main(["job", job_id]) == 0
    out = capsys.readouterr().out
    assert "torchrun train.py" in out
    assert f"gangway logs {job_id}" in out
    assert "elapsed" in out


def test_job_shows_a_command_as_written_never_as_terminal_codes_or_markup(
    api_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A team's command is any text but NUL: shown raw, its escape sequences cleared the
    screen or retitled the terminal of whoever looked (an admin looks at every team's), and
    its rich markup ([bold red]…[/]) was drawn as style, the brackets gone."""
    spec = (
        "name: esc\nteam: nlp\ngpus_per_task: 1\n"
        'command: ["echo", "\\e[2J\\e]0;owned\\a", "[bold]x[/]"]\n'
    )
    job_id = submit(tmp_path, capsys, spec)
    assert main(["job", job_id]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\a" not in out
    assert "\\x1b[2J\\x1b]0;owned\\x07" in out
    assert "[bold]x[/]" in out
