"""The holding gangs' timers, kept between cycles, so that the reactions phase visits only the
gangs that need it (core/reactions.py) instead of every holding gang in every cycle.

A gang with nothing new (not flagged for attention, so no exits, requests or lost hardware,
and not being preempted) needs the reactions phase only once one of its deadlines has come:
its launch timeout while reserved, its max runtime once started. Until then all it gives the
cycle is wake-up moments: those deadlines and, with backfill, its estimated end (or a moment
after `now` once it runs past its estimate). The cycle only takes the earliest future wake-up
(core/cycle.py), so all such gangs together are summed up as one moment, read off two heaps.

Nothing here decides: the gangs returned are visited by the same code as before, in the same
order (`holding_jobs` order), and the moment returned is the minimum of what the gangs not
visited would have added. It is a cache of the state, kept up to date from the state's
holding watch: a gang that enters, changes within or leaves the holding states gets fresh
entries, and its old ones, recognised by their token (an estimated end also by its moment: when
only the end moved, the gang keeps its token), are dropped when they reach the top.

The entries rest on a gang's estimate being a function of its spec, the policy and the
runtimes learned so far (core/reservation.py `runtime_estimate`, core/estimates.py): a job's
spec does not change while it holds a gang, a new policy object rebuilds the timers, and
whatever the estimator learns (a job ended) renews the estimated ends of the gangs whose
estimate it may have moved (those of the teams it learned from, and those that read what every
team feeds: core/estimates.py `reads_own_team`), or all of them when many teams learned.
"""

from __future__ import annotations

import heapq

from core.policy import SchedulingPolicy
from core.reservation import estimated_end, runtime_estimate
from core.state import CoreJob, HeldGang, HoldingWatch, rank_host
from core.state_index import StateIndex
from core.surface import PlanningSurface
from schemas.jobs import JobSpec

__all__ = ["GangTimers"]

_LAUNCH = 0  # a reserved gang whose ranks have not all started: due at its deadline
_LIMIT = 1  # a started gang's max runtime: due once past it

# (time, kind, token, job id) and (estimated end, token, job id)
_Deadline = tuple[float, int, int, str]
_End = tuple[float, int, str]


class GangTimers(StateIndex[HoldingWatch]):
    """One state's holding gangs by deadline and estimated end, kept by its planner."""

    __slots__ = (
        "_always",
        "_by_ratio",
        "_deadlines",
        "_end_of",
        "_ends",
        "_held",
        "_learned",
        "_next",
        "_order",
        "_overrun",
        "_ratio_of",
        "_token",
        "_unscaled",
    )

    def __init__(self) -> None:
        super().__init__()
        # Per holding gang: its place in `holding_jobs` order, and the token of its entries.
        self._order: dict[str, int] = {}
        self._token: dict[str, int] = {}
        self._next = 0
        self._deadlines: list[_Deadline] = []
        self._ends: list[_End] = []
        # Per gang with an estimated end, the end its current entry carries, and what the
        # head's reservation plan reads of it (`held_ends`).
        self._end_of: dict[str, float] = {}
        self._held: dict[str, HeldGang] = {}
        # Per gang with an estimate of its own (learned runtimes), its team and the team's ratio
        # that end was reckoned with: its estimate is the given one times that ratio
        # (core/estimates.py), so while the ratio stays, so does its end. The same gangs by
        # (team, ratio), so that when the estimator learns only those whose team's ratio moved
        # are looked at (on the Philly week with every estimate 4 h, 1.65 of the 2.27 million
        # gangs walked had the ratio still noted), and the other gangs with an end.
        self._ratio_of: dict[str, tuple[str, float | None]] = {}
        self._by_ratio: dict[tuple[str, float | None], dict[str, None]] = {}
        self._unscaled: dict[str, None] = {}
        # Gangs whose estimated end is at or before the latest `now` seen: token by job.
        self._overrun: dict[str, int] = {}
        # Gangs visited in every cycle (being preempted, or with no binding time).
        self._always: set[str] = set()
        # How many jobs the estimator had learned from when the estimated ends were pushed.
        self._learned = -1

    def gangs_to_visit(
        self, state: PlanningSurface, now: float, attention: set[str]
    ) -> tuple[list[CoreJob], float | None]:
        """The holding gangs the reactions phase must visit at `now`, in `holding_jobs` order
        (those flagged for attention, being preempted, or with a deadline come), and the
        earliest future wake-up that the gangs left out would have asked for (None: none)."""
        self._sync(state, now)
        holding = state.holding_jobs
        visit = {job_id for job_id in attention if job_id in holding}
        visit |= self._always
        token = self._token
        back: list[_Deadline] = []
        deadlines = self._deadlines
        while deadlines and deadlines[0][0] <= now:
            entry = heapq.heappop(deadlines)
            moment, kind, entry_token, job_id = entry
            if token.get(job_id) != entry_token:
                continue
            back.append(entry)
            # launch_overdue acts at its deadline, past_max_runtime only after its limit.
            if kind == _LAUNCH or moment < now:
                visit.add(job_id)
        ends, end_of = self._ends, self._end_of
        while ends and ends[0][0] <= now:
            moment, entry_token, job_id = heapq.heappop(ends)
            if token.get(job_id) == entry_token and end_of.get(job_id) == moment:
                self._overrun[job_id] = entry_token
        wakeup = float("inf")
        while deadlines:
            entry = deadlines[0]
            if token.get(entry[3]) != entry[2]:
                heapq.heappop(deadlines)
            elif entry[3] in visit:
                back.append(heapq.heappop(deadlines))
            else:
                wakeup = entry[0]
                break
        for entry in back:
            heapq.heappush(deadlines, entry)
        if state.policy.backfill:
            held: list[_End] = []
            while ends:
                end = ends[0]
                if token.get(end[2]) != end[1] or end_of.get(end[2]) != end[0]:
                    heapq.heappop(ends)
                elif end[2] in visit:
                    held.append(heapq.heappop(ends))
                else:
                    wakeup = min(wakeup, end[0])
                    break
            for end in held:
                heapq.heappush(ends, end)
            # estimated_end: a gang past its estimate may end at any moment after `now`, or
            # when jobs like it that ran as long ended (learned runtimes).
            # Such a gang (never one being preempted: those are visited) is planned to end
            # `overrun_grace_s` after `now` at the earliest, so once the wake-up is there no
            # other can bring it earlier.
            policy, estimates = state.policy, state.estimates
            floor = now + policy.overrun_grace_s
            if wakeup > floor:
                for job_id in self._overrun:
                    if job_id not in visit:
                        moment = estimated_end(holding[job_id], now, policy, estimates)
                        if moment < wakeup:
                            wakeup = moment
                            if wakeup <= floor:
                                break
        order = self._order
        gangs = [holding[job_id] for job_id in sorted(visit, key=order.__getitem__)]
        return gangs, (None if wakeup == float("inf") else wakeup)

    def held_ends(self) -> tuple[dict[str, float], dict[str, HeldGang]]:
        """Per holding gang with an estimated end of its own (neither being preempted nor
        without a binding time), that end and what the head's reservation plan reads of the
        gang (core/reservation.py `gang_ends`), as of the last `gangs_to_visit`: the plan runs
        in the same cycle, so the ends are those the estimator gives now. Only read: they are
        the timers' own."""
        return self._end_of, self._held

    # ------------------------------------------------------------ upkeep

    def _sync(self, state: PlanningSurface, now: float) -> None:
        watch = self._current(state, now)
        if watch is None:
            # Another state, a new policy, or the clock went back (gangs counted as past
            # their estimate may not be any more): build again from the state.
            self._rebuild(state)
        else:
            changes = watch.changes
            if changes:
                watch.changes = []
                self._apply(state, changes)
            if state.estimates.learned != self._learned:
                self._estimates_moved(state)
        if len(self._deadlines) + len(self._ends) > 4 * len(self._token) + 1024:
            self._compact()

    def _rebuild(self, state: PlanningSurface) -> None:
        self._bind(state, state.watch_holding(), type(state).unwatch_holding)
        self._order = {}
        self._token = {}
        self._deadlines = []
        self._ends = []
        self._end_of = {}
        self._held = {}
        self._ratio_of = {}
        self._by_ratio = {}
        self._unscaled = {}
        self._overrun = {}
        self._always = set()
        self._learned = state.estimates.learned
        self._next = 0
        for job in state.holding_jobs.values():
            self._next += 1
            self._order[job.job_id] = self._next
            self._push(state, job)

    def _apply(self, state: PlanningSurface, changes: list[tuple[str, bool]]) -> None:
        order = self._order
        for job_id, entered in changes:
            if entered:
                # A new gang goes to the end of `holding_jobs`, as it does in the state.
                self._next += 1
                order[job_id] = self._next
        holding = state.holding_jobs
        for job_id in dict.fromkeys(job_id for job_id, _ in changes):
            self._overrun.pop(job_id, None)
            self._always.discard(job_id)
            job = holding.get(job_id)
            if job is None:
                order.pop(job_id, None)
                self._token.pop(job_id, None)
                self._end_of.pop(job_id, None)
                self._held.pop(job_id, None)
                self._forget_ratio(job_id)
            else:
                self._push(state, job)

    def _push(self, state: PlanningSurface, job: CoreJob) -> None:
        self._next += 1
        token = self._token[job.job_id] = self._next
        if job.state == "preempting" or job.held_since is None:
            self._always.add(job.job_id)
            self._end_of.pop(job.job_id, None)
            self._held.pop(job.job_id, None)
            self._forget_ratio(job.job_id)
            return
        policy = state.policy
        if job.state == "reserved" and job.reserved_at is not None:
            moment = job.reserved_at + policy.launch_timeout_s
            heapq.heappush(self._deadlines, (moment, _LAUNCH, token, job.job_id))
        spec = job.spec
        if spec is not None and spec.max_runtime_s is not None and job.started_at is not None:
            moment = job.started_at + spec.max_runtime_s
            heapq.heappush(self._deadlines, (moment, _LIMIT, token, job.job_id))
        end = job.held_since + runtime_estimate(job, policy, state.estimates)
        self._end_of[job.job_id] = end
        # A gang's ranks, spec and binding time change only as it changes state (and is pushed
        # again): the ranks when it is bound and released, the start when its ranks all run.
        self._held[job.job_id] = (
            job.ranks,
            rank_host(spec),
            job.held_since,
            spec,
            _scaled_fields(policy, spec),
        )
        self._note_ratio(state, job)
        heapq.heappush(self._ends, (end, token, job.job_id))

    def _estimates_moved(self, state: PlanningSurface) -> None:
        """The estimator learned: new entries for the gangs whose estimate may have moved,
        those of the teams it learned from and those read from what every team feeds
        (core/estimates.py `reads_own_team`)."""
        estimates = state.estimates
        teams = estimates.teams_learned_since(self._learned)
        if 4 * len(teams) > estimates.teams_learned:
            # Many teams learned (a busy cycle of a few teams): renewing gang by gang costs
            # more than building the heap of estimated ends again (measured: with 20 teams
            # and half of them learned, renewing took react ~2 ms longer at 100k GPUs).
            self._rebuild_ends(state)
            return
        self._learned = estimates.learned
        # A gang whose estimate is its given one times its team's ratio can have moved only
        # if that ratio did: the groups noted with a ratio no longer their team's, renewed
        # group by group (`_renew_group`). The order of the end entries pushed decides
        # nothing: the heap yields them by moment and token whatever the order of pushing.
        # Other gangs are looked at alone; one that needs new tokens is pushed again in the
        # order of `_token`, as when every gang was walked.
        moved = [key for key in self._by_ratio if estimates.estimate_ratio(key[0]) != key[1]]
        again: set[str] = set()
        # Such a gang's estimate is its given estimate times the team's ratio, capped by its
        # limit (core/estimates.py): the same for every gang of the team with the same given
        # estimate and limit, so worked out once per call for them all (with every estimate
        # 4 h, a team's gangs are all one).
        scaled: dict[tuple[str, float | None, float | None], float] = {}
        holding = state.holding_jobs
        for key in moved:
            self._renew_group(state, key, scaled)
        for job_id in list(self._unscaled):
            if self._renew(state, holding.get(job_id), teams):
                again.add(job_id)
        if again:
            for job_id in [job_id for job_id in self._token if job_id in again]:
                self._overrun.pop(job_id, None)
                self._push(state, state.holding_jobs[job_id])

    def _renew_group(
        self,
        state: PlanningSurface,
        key: tuple[str, float | None],
        scaled: dict[tuple[str, float | None, float | None], float],
    ) -> None:
        """New end entries for the gangs noted with the team's ratio `key` (team, ratio), which
        is no longer the team's: each such gang's estimate is its given one times the team's
        ratio now, capped by its limit (`_regroup`'s gangs: a spec with an estimate, a policy
        that learns, an end of their own), the same for all gangs of one given estimate and
        limit. The whole group is noted with the ratio now: a gang whose end did not move has
        the end that ratio gives too. (What `_renew` does gang by gang, in one loop: on the
        Philly window the estimator learns 65,770 times, with some 50 gangs a team.)"""
        team = key[0]
        group = self._by_ratio.pop(key)
        noted = (team, state.estimates.estimate_ratio(team))
        # The whole group is noted with the ratio now, in C rather than gang by gang.
        self._ratio_of.update(dict.fromkeys(group, noted))
        target = self._by_ratio.get(noted)
        if target is None:
            self._by_ratio[noted] = group
        else:
            target.update(group)
        end_of, token, overrun = self._end_of, self._token, self._overrun
        policy, estimates = state.policy, state.estimates
        holding = state.holding_jobs
        ends = self._ends
        # The scaled estimate of the gang before, while the next has the same given estimate
        # and limit (a team's gangs nearly always do).
        given: float | None = None
        limit: float | None = None
        estimate: float | None = None
        for job_id in group:
            job = holding[job_id]
            spec = job.spec
            # Kept in these groups only with a spec, an end and a binding time (`_push`).
            assert spec is not None
            if estimate is None or spec.estimated_runtime_s != given or spec.max_runtime_s != limit:
                given, limit = spec.estimated_runtime_s, spec.max_runtime_s
                fields = (team, given, limit)
                estimate = scaled.get(fields)
                if estimate is None:
                    estimate = scaled[fields] = runtime_estimate(job, policy, estimates)
            # job.held_since inlined (its start, else its binding).
            held_since = job.started_at if job.started_at is not None else job.reserved_at
            assert held_since is not None
            end = held_since + estimate
            if end_of[job_id] != end:
                # Only its estimated end moved (its deadlines did not: nothing of the gang
                # changed): a new end entry under the same token; the old one no longer
                # matches `_end_of` and is dropped when it comes up.
                overrun.pop(job_id, None)
                end_of[job_id] = end
                heapq.heappush(ends, (end, token[job_id], job_id))

    def _renew(self, state: PlanningSurface, job: CoreJob | None, teams: frozenset[str]) -> bool:
        """A new end entry for the holding gang with no given estimate scaled (`_unscaled`) if
        the estimator moved its estimate; True: the gang has no end to move and must be pushed
        again whole."""
        spec = job.spec if job is not None else None
        if job is None or spec is None or job.job_id in self._always:
            return False  # no spec: the policy's default, whatever is learned
        job_id = job.job_id
        estimates = state.estimates
        if spec.team in teams or not estimates.reads_own_team(job_id, spec):
            # Nearly always the estimate did not move (a team's ratio or quantile is
            # seldom changed by one more sample): its entry stands as it is. (One pushed
            # again, with the same end, would come back the same: to the overrun gangs
            # when its end has passed, whose order decides nothing.)
            held_since = job.held_since
            if held_since is None or job_id not in self._end_of:
                return True
            end = held_since + runtime_estimate(job, state.policy, estimates)
            if self._end_of[job_id] == end:
                return False
            # Only its estimated end moved (its deadlines did not: nothing of the gang
            # changed): a new end entry under the same token; the old one no longer
            # matches `_end_of` and is dropped when it comes up.
            self._overrun.pop(job_id, None)
            self._end_of[job_id] = end
            self._note_ratio(state, job)
            heapq.heappush(self._ends, (end, self._token[job_id], job_id))
        return False

    def _rebuild_ends(self, state: PlanningSurface) -> None:
        """The estimated ends again, under what the estimator has learned since.

        What `_note_ratio` and `runtime_estimate` give gang by gang, in one loop: a gang
        noted with its team's ratio has the estimate of every gang of its team with the same
        given estimate and limit (as in `_renew_group`), worked out once for them all (in the
        bench's busy cycles ~1,800 gangs of a few teams: this ran in every cycle). The gangs
        with an end are those `_held` keeps, with their start and those fields: their records
        (cold in a busy cycle) are read only to work out an estimate."""
        estimates = state.estimates
        self._learned = estimates.learned
        policy, token = state.policy, self._token
        holding = state.holding_jobs
        ends: list[_End] = []
        end_of: dict[str, float] = {}
        ratio_of: dict[str, tuple[str, float | None]] = {}
        by_ratio: dict[tuple[str, float | None], dict[str, None]] = {}
        unscaled: dict[str, None] = {}
        noted_of: dict[str, tuple[str, float | None]] = {}
        scaled: dict[tuple[str, float, float | None], float] = {}
        for job_id, (_, _, held_since, _, fields) in self._held.items():
            if fields is not None:
                team = fields[0]
                estimate = scaled.get(fields)
                if estimate is None:
                    estimate = scaled[fields] = runtime_estimate(holding[job_id], policy, estimates)
                noted = noted_of.get(team)
                if noted is None:
                    noted = noted_of[team] = (team, estimates.estimate_ratio(team))
                ratio_of[job_id] = noted
                group = by_ratio.get(noted)
                if group is None:
                    group = by_ratio[noted] = {}
                group[job_id] = None
            else:
                estimate = runtime_estimate(holding[job_id], policy, estimates)
                unscaled[job_id] = None
            end = held_since + estimate
            end_of[job_id] = end
            ends.append((end, token[job_id], job_id))
        heapq.heapify(ends)
        self._overrun = {}
        self._ends = ends
        self._end_of = end_of
        self._ratio_of = ratio_of
        self._by_ratio = by_ratio
        self._unscaled = unscaled

    def _note_ratio(self, state: PlanningSurface, job: CoreJob) -> None:
        """Note the ratio the gang's new end was reckoned with (a gang with an end)."""
        spec = job.spec
        job_id = job.job_id
        if (
            state.policy.learned_runtimes
            and spec is not None
            and spec.estimated_runtime_s is not None
        ):
            self._regroup(job_id, (spec.team, state.estimates.estimate_ratio(spec.team)))
        else:
            old = self._ratio_of.pop(job_id, None)
            if old is not None:
                self._leave_group(job_id, old)
            self._unscaled[job_id] = None

    def _regroup(self, job_id: str, noted: tuple[str, float | None]) -> None:
        """The gang's end was reckoned with its team's ratio `noted` (team, ratio)."""
        old = self._ratio_of.get(job_id)
        if old == noted:
            return
        if old is None:
            self._unscaled.pop(job_id, None)
        else:
            self._leave_group(job_id, old)
        self._ratio_of[job_id] = noted
        self._by_ratio.setdefault(noted, {})[job_id] = None

    def _forget_ratio(self, job_id: str) -> None:
        """The gang has no end of its own any more (being preempted, or gone)."""
        self._unscaled.pop(job_id, None)
        old = self._ratio_of.pop(job_id, None)
        if old is not None:
            self._leave_group(job_id, old)

    def _leave_group(self, job_id: str, key: tuple[str, float | None]) -> None:
        group = self._by_ratio[key]
        del group[job_id]
        if not group:
            del self._by_ratio[key]

    def _compact(self) -> None:
        token = self._token
        self._deadlines = [entry for entry in self._deadlines if token.get(entry[3]) == entry[2]]
        heapq.heapify(self._deadlines)
        end_of = self._end_of
        self._ends = [
            end
            for end in self._ends
            if token.get(end[2]) == end[1] and end_of.get(end[2]) == end[0]
        ]
        heapq.heapify(self._ends)


def _scaled_fields(
    policy: SchedulingPolicy, spec: JobSpec | None
) -> tuple[str, float, float | None] | None:
    """What a gang's estimate rests on when it is its given estimate scaled by its team's ratio
    (core/estimates.py; `_note_ratio`'s gangs): (team, given estimate, limit); None for any
    other gang."""
    if policy.learned_runtimes and spec is not None and spec.estimated_runtime_s is not None:
        return spec.team, spec.estimated_runtime_s, spec.max_runtime_s
    return None
