"""`gangway logs -f JOB` right after `gangway submit` waits for the job to start, then follows
its output: it failed at once with 'output of job … (it has not started) not found'."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from gangway.cli import main
from gangway.client import ClientError
from gangway.commands import logs as logs_command


class Api:
    """A stand-in for the API: the job waits `waits` reads of it, then runs and has output."""

    def __init__(self, waits: int, final: str = "running") -> None:
        self.waits = waits
        self.final = final
        self.reads = 0

    def __enter__(self) -> Api:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def job(self, job_id: str) -> dict[str, Any]:
        self.reads += 1
        if self.reads <= self.waits:
            return {"id": job_id, "state": "queued", "attempts": 0}
        return {"id": job_id, "state": self.final, "attempts": 1 if self.final == "running" else 0}

    def logs(self, job_id: str, **params: Any) -> Iterator[bytes]:
        if self.reads <= self.waits or self.final != "running":
            raise ClientError(f"output of job {job_id} (it has not started) not found")
        yield b"step 1\n"


@pytest.fixture(autouse=True)
def no_sleep(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(logs_command, "START_POLL_S", 0.0, raising=False)


def test_follow_waits_for_a_job_to_start(
    monkeypatch: pytest.MonkeyPatch, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    api = Api(waits=3)
    monkeypatch.setattr(logs_command, "client", lambda: api)
    assert main(["logs", "j1", "-f"]) == 0
    out, err = capsysbinary.readouterr()
    assert out == b"step 1\n"
    assert err == b"waiting for job j1 to start (queued)\n"


def test_follow_of_a_job_ended_unstarted_and_without_follow_still_fail(
    monkeypatch: pytest.MonkeyPatch, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    monkeypatch.setattr(logs_command, "client", lambda: Api(waits=1, final="cancelled"))
    assert main(["logs", "j1", "-f"]) == 1
    assert b"has not started" in capsysbinary.readouterr().err
    monkeypatch.setattr(logs_command, "client", lambda: Api(waits=5))
    assert main(["logs", "j1"]) == 1
    assert b"has not started" in capsysbinary.readouterr().err
