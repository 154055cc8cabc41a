"""The jobs' listing index: for each team and each state (and for all of them), the jobs'
submission positions in order, so that a page of `GET /v1/jobs` costs its own length.

Listing used to scan and sort every job of the read model on each request: one tenant paging
its own handful of jobs cost as much as the whole cluster's history, for every other tenant too.
Here a page is one bisection for its cursor and a slice of `limit + 1` positions.

A job's team and submission position never change; its state does, so a state change moves
the job between two of its four lists (a bisection and a list shift: jobs change state mostly
near the newest end, where the shift is short).
"""

from __future__ import annotations

from bisect import bisect_right, insort
from dataclasses import dataclass, field

from services.api.projections.jobs import JobReadModel

# (team or None for every team, state or None for every state).
Key = tuple[str | None, str | None]


@dataclass(slots=True)
class JobListing:
    _lists: dict[Key, list[int]] = field(default_factory=dict)
    _ids: dict[int, str] = field(default_factory=dict)

    def update(self, before: JobReadModel | None, after: JobReadModel) -> None:
        """Keep the index in step with one job's change (`before` None: a new job)."""
        position = after.submit_position
        if position <= 0:
            return  # not yet in the log: no cursor could name it (as listing always had it)
        team = after.spec.team
        if before is None:
            self._ids[position] = after.id
            for key in ((team, None), (None, None), (team, after.state), (None, after.state)):
                insort(self._lists.setdefault(key, []), position)
            return
        if before.state == after.state:
            return
        for key in ((team, before.state), (None, before.state)):
            self._remove(key, position)
        for key in ((team, after.state), (None, after.state)):
            insort(self._lists.setdefault(key, []), position)

    def _remove(self, key: Key, position: int) -> None:
        positions = self._lists.get(key)
        if positions is None:
            return
        at = bisect_right(positions, position) - 1
        if at >= 0 and positions[at] == position:
            del positions[at]

    def ids(self, team: str | None, state: str) -> list[str]:
        """Every job of `team` (None: of every team) now in `state`, oldest first."""
        return [self._ids[position] for position in self._lists.get((team, state), ())]

    def page(
        self, team: str | None, state: str | None, after: int, limit: int
    ) -> tuple[list[str], int | None]:
        """The ids of up to `limit` jobs submitted after position `after`, oldest first, and
        the cursor of the next page (None when this is the last)."""
        positions = self._lists.get((team, state), [])
        start = bisect_right(positions, after)
        chosen = positions[start : start + limit + 1]
        more = len(chosen) > limit
        chosen = chosen[:limit]
        return [self._ids[position] for position in chosen], chosen[-1] if more else None
