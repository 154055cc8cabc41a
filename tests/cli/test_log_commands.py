"""gangway replay [--verify] and gangway audit, reading the real log directly."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from gangway.cli import main
from schemas.base import Event
from schemas.jobs import JobAdmitted, JobDeferred, TaskStarted
from schemas.nodes import NodeDrained
from services.runtime import EventStore, Settings
from tests.api.builders import node, reserved, submitted

pytestmark = pytest.mark.integration


def record(settings: Settings, *events: Event) -> None:
    """Append as the services would, each event to its own stream."""

    async def append() -> None:
        store = await EventStore.connect(settings, producer="tests")
        try:
            for event in events:
                await store.append(event.stream, None, [event])
        finally:
            await store.close()

    asyncio.run(append())


def running_job(job_id: str, gpus: list[int]) -> list[Event]:
    return [
        submitted(job_id, tasks=1, gpus_per_task=len(gpus)),
        JobAdmitted(job_id=job_id, queue="nlp", priority="research"),
        reserved(job_id, [("n1", gpus)]),
        TaskStarted(job_id=job_id, attempt=1, rank=0, node_id="n1"),
    ]


def waiting_job(job_id: str) -> list[Event]:
    return [
        submitted(job_id, tasks=2, gpus_per_task=8),
        JobAdmitted(job_id=job_id, queue="nlp", priority="research"),
        JobDeferred(job_id=job_id, code="no_capacity", message="needs 16 GPUs; 4 are free"),
    ]


def test_replay_folds_the_whole_log_and_reports_its_speed(
    log_env: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    record(log_env, node("n1"), *running_job("a", [0, 1, 2, 3]), *waiting_job("b"))
    assert main(["replay"]) == 0
    out = capsys.readouterr().out
    assert "events/s" in out
    assert "2 jobs (1 pending)" in out and "4/8 GPUs allocated" in out


def test_replay_verify_finds_every_fold_in_agreement(
    log_env: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    record(log_env, node("n1"), *running_job("a", [0, 1, 2, 3]), *waiting_job("b"))
    assert main(["replay", "--verify"]) == 0
    out = capsys.readouterr().out
    assert "OK snapshot + tail vs full replay" in out and "OK read models vs core" in out


def test_audit_of_a_sound_log_exits_0(
    log_env: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    record(log_env, node("n1"), *running_job("a", [0, 1, 2, 3]), *waiting_job("b"))
    assert main(["audit"]) == 0
    assert "no invariant violations" in capsys.readouterr().out


def test_audit_of_a_gpu_bound_twice_lists_the_violation_and_exits_1(
    log_env: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    record(log_env, node("n1"), *running_job("a", [0, 1]), *running_job("b", [1, 2]))
    assert main(["audit"]) == 1
    out = capsys.readouterr().out
    assert "a GPU is bound to at most one gang" in out


def test_audit_reports_a_broken_scheduling_rule_by_its_name_and_exits_1(
    log_env: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    # A scheduling promise of DESIGN §3, not an invariant: a node is reported drained while a
    # gang still holds GPUs on it (the auditor's `drain` rule).
    record(log_env, node("n1"), *running_job("a", [0, 1]), NodeDrained(node_id="n1"))
    assert main(["audit"]) == 1
    out = capsys.readouterr().out
    assert "a node is reported drained only when no gang holds it" in out
    assert "node n1 reported drained while job a still holds GPUs on it" in out
    assert "1 invariant violation(s)" in out


def test_an_unreachable_log_is_a_one_line_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("GANGWAY_PG_DSN", "postgresql://nobody:secret@127.0.0.1:1/none")
    assert main(["audit"]) != 0
    err = capsys.readouterr().err
    assert err.startswith("gangway: cannot open the event log") and "secret" not in err


def test_audit_from_a_subdirectory_reads_the_checkouts_log(
    settings: Settings,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The DSN comes from the nearest `.gangway/env`, not from the default port."""
    record(settings, node("n1"), *running_job("sub", [0]))
    (tmp_path / ".gangway").mkdir()
    (tmp_path / ".gangway" / "env").write_text(f"GANGWAY_PG_DSN={settings.pg_dsn}\n")
    (tmp_path / "docs").mkdir()
    monkeypatch.delenv("GANGWAY_PG_DSN", raising=False)
    monkeypatch.chdir(tmp_path / "docs")

    status = main(["audit"])
    out = capsys.readouterr().out
    assert status == 0 and "audited 5 events" in out and "no invariant violations" in out, out
