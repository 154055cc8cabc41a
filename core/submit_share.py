"""The submit path's fair share among teams: one team's flood must not slow another's
submissions.

Every job a team submits costs the whole pipeline behind the API (the log, the relay, Kafka,
admission, the scheduler and every API worker's read models) about the same, whoever sends it
and however it is packed (a batch of 200 costs 200 jobs' worth). A team alone may use all of
it. While other teams submit too, the jobs a second all teams may submit together are
`shared_rate`, shared max-min fairly: each team may use what the others leave, and never less
than an equal share. A team that submits little (below its equal share) is so never held back,
and the flood is held below what saturates the cores, so the quiet team's submissions find the
pipeline free.

Plain functions over plain data: times are seconds of the log's clock (events' recorded
times), passed in.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

# How far back a team's jobs count towards its use of the shared rate, unless told.
USAGE_WINDOW_S: Final = 1.0
# How long after its last submission a team still counts as submitting (at least the window):
# the flood stays held between the submissions of a team that submits every few seconds, which
# would otherwise find a saturated pipeline each time.
PRESENCE_S: Final = 10.0
# How long a request waits for jobs in flight (let through, not yet recorded) to be recorded.
IN_FLIGHT_WAIT_S: Final = 0.05


@dataclass(slots=True)
class RecentSubmissions:
    """The jobs each team submitted within the last `window_s`, and when each team last
    submitted, as of the newest time seen."""

    window_s: float = USAGE_WINDOW_S
    # (recorded time, team), oldest first: one entry per job
    _window: deque[tuple[float, str]] = field(default_factory=deque)
    _used: Counter[str] = field(default_factory=Counter)
    _last: dict[str, float] = field(default_factory=dict)

    def add(self, team: str, at: float) -> None:
        """One job of `team` submitted at `at`. Jobs come nearly in time order (the bus may
        bring another worker's a little late): one recorded earlier than those before it leaves
        the window with them, a moment late, never early."""
        self._window.append((at, team))
        self._used[team] += 1
        if at > self._last.get(team, float("-inf")):
            self._last[team] = at
        self._expire(at)

    def used(self, now: float) -> Mapping[str, int]:
        """Jobs per team within the window ending at `now`."""
        self._expire(now)
        return self._used

    def present(self, now: float) -> list[str]:
        """The teams that submitted within `PRESENCE_S` (or the window) before `now`."""
        horizon = now - max(PRESENCE_S, self.window_s)
        gone = [team for team, at in self._last.items() if at <= horizon]
        for team in gone:
            del self._last[team]
        return list(self._last)

    def freed_after(self, team: str, jobs: int, now: float) -> float:
        """Seconds from `now` until `jobs` of the team's jobs in the window have left it (all
        of them, when it holds fewer)."""
        left = 0.0
        for at, owner in self._window:
            if owner == team:
                left = at + self.window_s - now
                jobs -= 1
                if jobs <= 0:
                    break
        return max(0.0, left)

    def _expire(self, now: float) -> None:
        horizon = now - self.window_s
        window, used = self._window, self._used
        while window and window[0][0] <= horizon:
            _, team = window.popleft()
            used[team] -= 1
            if not used[team]:
                del used[team]


def budget_wait(
    recent: RecentSubmissions,
    team: str,
    jobs: int,
    rate: float | None,
    now: float,
    in_flight: int = 0,
) -> float | None:
    """None when `team`, held to `rate` jobs a second of its own (its policy's
    `jobs_per_second`, alone or not), may submit `jobs` more at `now`; else the seconds until
    enough of its jobs have left the window. Its jobs within the window, with those `in_flight`
    and these, may reach the rate times the window; a team with none may always submit."""
    if rate is None:
        return None
    mine = recent.used(now).get(team, 0) + in_flight
    if mine == 0:
        return None
    excess = mine + jobs - rate * recent.window_s
    if excess <= 0:
        return None
    freed = recent.freed_after(team, math.ceil(excess), now)
    return freed if freed > 0 else IN_FLIGHT_WAIT_S


def share_wait(
    recent: RecentSubmissions,
    team: str,
    jobs: int,
    shared_rate: float | None,
    now: float,
    in_flight: int = 0,
) -> float | None:
    """None when `team` may submit `jobs` more jobs at `now`; else the seconds until enough
    of its jobs have left the window (other teams' use may have grown by then: ask again).

    Alone (no other team submitted within `PRESENCE_S`, or the window), a team is never held
    here. Otherwise its jobs within the window, with those `in_flight` (let through, not yet
    recorded) and these, may reach the larger of an equal share of `shared_rate` and what the
    other teams leave of it; a team with none may always submit (a batch larger than its share
    is not refused for ever).
    """
    if shared_rate is None:
        return None
    present = recent.present(now)
    others = [other for other in present if other != team]
    if not others:
        return None
    used = recent.used(now)
    mine = used.get(team, 0) + in_flight
    if mine == 0:
        return None
    budget = shared_rate * recent.window_s
    allowance = max(budget / (len(others) + 1), budget - sum(used.get(o, 0) for o in others))
    excess = mine + jobs - allowance
    if excess <= 0:
        return None
    freed = recent.freed_after(team, math.ceil(excess), now)
    # Only jobs still in flight stand in the way: they are recorded within moments.
    return freed if freed > 0 else IN_FLIGHT_WAIT_S
