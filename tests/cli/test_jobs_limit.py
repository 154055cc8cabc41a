"""`gangway jobs --limit N` keeps the N newest jobs, as its help says, whatever their state."""

import argparse
from typing import Any

from gangway.commands.jobs import add_arguments, select


class Jobs:
    """A stand-in for the API's job list: one page, filtered by state like the API."""

    def __init__(self, rows: list[dict[str, Any]]) -> None:
        self.rows = rows

    def jobs(
        self, *, team: str | None, state: str | None, limit: int, after: int | None
    ) -> dict[str, Any]:
        items = [row for row in self.rows if state is None or row["state"] == state]
        return {"items": items, "next": None}


def job(job_id: str, state: str, minute: int) -> dict[str, Any]:
    return {"id": job_id, "state": state, "submitted_at": f"2026-11-24T22:{minute:02d}:00Z"}


def args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


ROWS = [
    job("old-running", "running", 1),
    job("new-done", "succeeded", 5),
    job("newer-done", "failed", 6),
    job("mid-queued", "queued", 3),
]


def test_all_with_a_limit_keeps_the_newest_jobs_active_ones_first() -> None:
    # Before: the first N rows of "active first", so the oldest running job stood in for
    # the newest finished ones.
    shown = select(Jobs(ROWS), args("--all", "--limit", "2"))  # type: ignore[arg-type]
    assert [row["id"] for row in shown] == ["newer-done", "new-done"]
    shown = select(Jobs(ROWS), args("--all", "--limit", "3"))  # type: ignore[arg-type]
    assert [row["id"] for row in shown] == ["mid-queued", "newer-done", "new-done"]


def test_without_a_limit_active_jobs_come_first_newest_first() -> None:
    shown = select(Jobs(ROWS), args("--all"))  # type: ignore[arg-type]
    assert [row["id"] for row in shown] == ["mid-queued", "old-running", "newer-done", "new-done"]
    shown = select(Jobs(ROWS), args("--limit", "1"))  # type: ignore[arg-type]
    assert [row["id"] for row in shown] == ["mid-queued"]
