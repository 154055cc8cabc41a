"""Periodic checkpoints: which running gangs are due for one (`checkpoint.interval_s`).

Pure: times come in as arguments (monotonic seconds).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class _Gang:
    attempt: int
    interval_s: float
    next_due: float


class PeriodicCheckpoints:
    """`min_interval_s` is the cluster's floor: a job asking for checkpoints more often than
    that gets them that often (each one stops the world on every rank and writes storage)."""

    def __init__(self, min_interval_s: float = 0.0) -> None:
        self._gangs: dict[str, _Gang] = {}
        self.min_interval_s = min_interval_s

    def __len__(self) -> int:
        return len(self._gangs)

    def started(self, job_id: str, attempt: int, interval_s: float | None, now: float) -> None:
        """A gang of the job runs from `now`; its first checkpoint is due one interval later."""
        if interval_s is None:
            self._gangs.pop(job_id, None)
            return
        interval_s = max(interval_s, self.min_interval_s)
        self._gangs[job_id] = _Gang(attempt, interval_s, now + interval_s)

    def stopped(self, job_id: str, attempt: int | None = None) -> None:
        gang = self._gangs.get(job_id)
        if gang is not None and (attempt is None or gang.attempt == attempt):
            del self._gangs[job_id]

    def missed(self, job_id: str, attempt: int) -> None:
        """The request `due` gave for (job, attempt) was never recorded (the log was away):
        it is due again at once, not one interval later, unless that gang has ended."""
        gang = self._gangs.get(job_id)
        if gang is not None and gang.attempt == attempt:
            gang.next_due = float("-inf")

    def due(self, now: float) -> list[tuple[str, int]]:
        """The (job, attempt) pairs due now; each is next due one interval from now (a slow
        round never makes a burst of catch-up checkpoints)."""
        found = []
        for job_id, gang in sorted(self._gangs.items()):
            if now >= gang.next_due:
                found.append((job_id, gang.attempt))
                gang.next_due = now + gang.interval_s
        return found
