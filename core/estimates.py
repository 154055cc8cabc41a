"""Runtime estimates learned from the log: how long a job's gang will hold its GPUs.

Most users give no `estimated_runtime_s`, and those who do are often wrong. The scheduler needs
a guess all the same (the head's reservation, backfill, `why`'s estimated start), so it learns
one from the jobs that ended: `RuntimeEstimates` is a fold over the recorded events, like the
state, so a restarted scheduler (or the auditor) replaying the log predicts exactly the same.

What a job "ran" is the time its gangs held GPUs, summed over its attempts (from each
GangReserved to the release of that attempt): what a reservation needs to know. Jobs that
succeeded or failed teach it (a failure holds GPUs as long as it ran). A cancelled job's run is
a lower bound (its length was a person's decision: the job would have run at least that long),
and so is a failed job's for the ratio to its user's estimate: such a bound is learned only
where it raises what is predicted (`_learn_bound`), so that cancelling, or failing, after a long
run corrects a team that under-estimates, and cancelling early teaches nothing that shortens a
prediction (no team gains a place in short-work-first order, or a backfill, by cancelling).

Samples are kept per key, from the most specific to the most general:

1. the same job name in the same team (a job run again, an array's elements);
2. the name's prefix in the same team (`resnet50-lr0.1` and `resnet50-lr0.2` share `resnet50`);
3. the team and the gang's GPU count;
4. the team;
5. the GPU count;
6. every job.

A prediction comes from the most specific key with `MIN_SAMPLES` samples: the `QUANTILE`
of its last `WINDOW` samples (recent work counts, old habits fade). The spec carries no user
identity (a team's tokens are the team's), so "by user" is by team here.

A user's own estimate is combined, not replaced: once a team's finished jobs show how far
their estimates were off (the ratio of what ran to what was estimated, a median over the last
`WINDOW`), an estimate is scaled by that ratio. An estimate, learned or given, is never a
limit: nothing is preempted or killed for running past it (only `max_runtime_s` ends a job);
the reservations that counted on it are planned again.
"""

from __future__ import annotations

import bisect
import math
import re
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from schemas.base import Event
from schemas.jobs import (
    GangReserved,
    JobCancelled,
    JobFailed,
    JobRejected,
    JobRequeued,
    JobSpec,
    JobSubmitted,
    JobSucceeded,
    JobSuspended,
    JobUpdated,
)

# Samples a key needs before it predicts (fewer: a more general key speaks).
MIN_SAMPLES = 3
# The last samples a key keeps.
WINDOW = 64
# Which quantile of a key's samples is the prediction: a little above the median, since a
# backfilled job that runs longer than planned delays the head, and one shorter costs nothing.
QUANTILE = 0.6
# A job past its estimate is planned to run at least this much longer (it has not ended yet).
MIN_REMAINING_S = 60.0

# The name's stem: what comes before the first separator or digit run that follows a letter.
_PREFIX = re.compile(r"^[A-Za-z]+[A-Za-z0-9]*?(?=[-_.:/]|\d+$)")

Key = tuple[str | int, ...]
_FOLDED: frozenset[type[Event]] = frozenset(
    {
        JobSubmitted,
        GangReserved,
        JobRequeued,
        JobSuspended,
        JobSucceeded,
        JobFailed,
        JobCancelled,
        JobRejected,
        JobUpdated,
    }
)


def name_prefix(name: str) -> str | None:
    """The family a job name belongs to (`bert-large-lr3` → `bert`), or None when the name is
    its own family (nothing to strip)."""
    match = _PREFIX.match(name)
    if match is None or match.group(0) == name:
        return None
    return match.group(0)


def keys_of(spec: JobSpec) -> tuple[Key, ...]:
    """The keys the job's runtime is learned under, most specific first."""
    gpus = spec.tasks * max(spec.gpus_per_task, 1)
    keys: list[Key] = [("name", spec.team, spec.name)]
    prefix = name_prefix(spec.name)
    if prefix is not None:
        keys.append(("prefix", spec.team, prefix))
    keys += [("team-gpus", spec.team, gpus), ("team", spec.team), ("gpus", gpus), ("all",)]
    return tuple(keys)


@dataclass(slots=True)
class Samples:
    """A key's last `WINDOW` samples, with a sorted copy for quantiles (rebuilt on change)."""

    recent: deque[float] = field(default_factory=lambda: deque(maxlen=WINDOW))
    _sorted: list[float] | None = None
    # The prediction (the QUANTILE) and the median, asked for every running gang each cycle.
    _predicted: float | None = None
    _median: float | None = None

    # Bumped by every sample: answers memoised against it hold until it moves.
    changes: int = 0
    # Fed by every team's jobs (the "gpus" and "all" keys), not by one team's only.
    shared: bool = False

    def add(self, value: float) -> None:
        self.recent.append(value)
        self._sorted = None
        self._predicted = None
        self._median = None
        self.changes += 1

    def __len__(self) -> int:
        return len(self.recent)

    @property
    def ordered(self) -> list[float]:
        if self._sorted is None:
            self._sorted = sorted(self.recent)
        return self._sorted

    def quantile(self, q: float = QUANTILE) -> float:
        ordered = self.ordered
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    @property
    def median(self) -> float:
        if self._median is None:
            self._median = self.quantile(0.5)
        return self._median

    @property
    def predicted(self) -> float:
        if self._predicted is None:
            self._predicted = self.quantile()
        return self._predicted

    def quantile_above(self, floor: float, q: float = QUANTILE) -> float | None:
        """The quantile of the samples longer than `floor`: what a job that has already run
        `floor` seconds may still run, by jobs like it that ran that long. None: none did."""
        return self.above(floor, q)[0]

    def above(self, floor: float, q: float = QUANTILE) -> tuple[float | None, float, float]:
        """`quantile_above(floor)`, and the range of floors [low, high) that give the same
        answer (those with the same samples at or below them)."""
        ordered = self.ordered
        first = bisect.bisect_right(ordered, floor)
        low = ordered[first - 1] if first > 0 else -math.inf
        above = len(ordered) - first
        if above == 0:
            return None, low, math.inf
        return ordered[first + min(above - 1, int(q * above))], low, ordered[first]


@dataclass(slots=True)
class _Live:
    keys: tuple[Key, ...]
    team: str
    user_estimate_s: float | None
    attempt: int = 0
    bound_at: float | None = None
    held_s: float = 0.0


class RuntimeEstimates:
    """The estimator's state, folded from events: `apply(event, at)`, then ask."""

    def __init__(self) -> None:
        self._samples: dict[Key, Samples] = {}
        # Ratio of what ran to what the user estimated, per team and overall.
        self._ratios: dict[Key, Samples] = {}
        self._live: dict[str, _Live] = {}
        self.learned = 0
        # Which key speaks for a job changes only when some key first reaches MIN_SAMPLES
        # (a new generation); the cycle asks for every running gang's end every time.
        self._generation = 0
        # Per team, how many jobs had been learned from once its latest was
        # (`teams_learned_since`).
        self._team_learned: dict[str, int] = {}
        self._resolved: dict[str, tuple[int, Samples | None]] = {}
        # Each team's ratio, until some ratio is learned: (ratios learned, ratio).
        self._ratio_changes = 0
        self._team_ratio: dict[str, tuple[int, float | None]] = {}
        # An overrunning gang's expected length (a longer sample, or None), for the range of
        # run times that give the same answer: (samples, their changes, low, high, length).
        self._longer: dict[str, tuple[Samples, int, float, float, float | None]] = {}

    # ---------------------------------------------------------------- fold

    def apply(self, event: Event, at: float) -> None:
        kind = type(event)
        if kind not in _FOLDED:
            return  # most of a log (ranks starting and exiting, reasons): one set lookup
        if kind is JobSubmitted:
            assert isinstance(event, JobSubmitted)
            if event.job_id not in self._live:
                spec = event.spec
                self._live[event.job_id] = _Live(keys_of(spec), spec.team, spec.estimated_runtime_s)
            return
        if kind is GangReserved:
            assert isinstance(event, GangReserved)
            live = self._live.get(event.job_id)
            if live is not None and live.bound_at is None:
                live.attempt, live.bound_at = event.attempt, at
            return
        if kind is JobRequeued or kind is JobSuspended:
            assert isinstance(event, JobRequeued | JobSuspended)
            live = self._live.get(event.job_id)
            if live is not None and (event.attempt is None or event.attempt == live.attempt):
                self._unbind(live, at)
            return
        if kind is JobSucceeded or kind is JobFailed:
            assert isinstance(event, JobSucceeded | JobFailed)
            live = self._live.pop(event.job_id, None)
            self._resolved.pop(event.job_id, None)
            self._longer.pop(event.job_id, None)
            if live is not None:
                self._unbind(live, at)
                if live.held_s > 0:
                    self._learn(live, succeeded=kind is JobSucceeded)
            return
        if kind is JobCancelled or kind is JobRejected:
            job_id = str(getattr(event, "job_id", ""))
            live = self._live.pop(job_id, None)
            self._resolved.pop(job_id, None)
            self._longer.pop(job_id, None)
            if live is not None and kind is JobCancelled:
                self._unbind(live, at)
                if live.held_s > 0:
                    self._learn_bound(live)
            return
        if kind is JobUpdated:
            assert isinstance(event, JobUpdated)
            live = self._live.get(event.job_id)
            estimate = event.changes.estimated_runtime_s
            if live is not None and estimate is not None:
                live.user_estimate_s = estimate

    @staticmethod
    def _unbind(live: _Live, at: float) -> None:
        if live.bound_at is not None:
            live.held_s += max(0.0, at - live.bound_at)
            live.bound_at = None

    def _learn(self, live: _Live, succeeded: bool) -> None:
        self._add_samples(live, live.keys)
        if live.user_estimate_s is not None:
            ratio = live.held_s / live.user_estimate_s
            if succeeded:
                self._add_ratios(ratio, (("team", live.team), ("all",)))
            else:
                # A failure cut the run short: it would have run at least this much longer
                # than its user said.
                self._add_ratios(ratio, self._ratios_raised(live.team, ratio))
        self._learned_from(live.team)

    def _learn_bound(self, live: _Live) -> None:
        """A cancelled run: the job would have held its GPUs at least `held_s`, and its user's
        estimate was off by at least that ratio. Each is added only to the keys (and ratios)
        it raises, or to one that does not predict yet when it is at least what the more
        general ones predict: a sample at or past a key's longest run lowers none of its
        quantiles (`beyond_s`'s, of the runs longer than a gang has run, included), so no
        prediction is shorter for the cancel than without it (a run cut early says nothing of
        how long the job is), and a long run cut by its owner counts as it ran."""
        keys = _raising(self._samples, tuple(reversed(live.keys)), live.held_s, None, _longest)
        self._add_samples(live, keys)
        ratios: tuple[Key, ...] = ()
        if live.user_estimate_s is not None:
            ratio = live.held_s / live.user_estimate_s
            ratios = self._ratios_raised(live.team, ratio)
            self._add_ratios(ratio, ratios)
        if keys or ratios:
            # The team's predictions may have moved (`teams_learned_since`), by a ratio alone
            # too: a job that gives an estimate reads only its team's ratio.
            self._learned_from(live.team)

    def _ratios_raised(self, team: str, ratio: float) -> tuple[Key, ...]:
        """The ratios (everyone's, the team's) a lower bound on a ratio raises; with none
        learned, an estimate is taken as given (a ratio of 1)."""
        return _raising(self._ratios, (("all",), ("team", team)), ratio, 1.0, _median)

    def _add_samples(self, live: _Live, keys: tuple[Key, ...]) -> None:
        for key in keys:
            samples = self._samples.get(key)
            if samples is None:
                samples = self._samples[key] = Samples(shared=key[0] in ("gpus", "all"))
            samples.add(live.held_s)
            if len(samples) == MIN_SAMPLES:
                self._generation += 1

    def _add_ratios(self, ratio: float, keys: tuple[Key, ...]) -> None:
        for key in keys:
            self._ratios.setdefault(key, Samples()).add(ratio)
        if keys:
            self._ratio_changes += 1

    def _learned_from(self, team: str) -> None:
        self.learned += 1
        self._team_learned[team] = self.learned

    def teams_learned_since(self, learned: int) -> frozenset[str]:
        """The teams of the jobs learned from since the estimator had learned from `learned`:
        with `reads_own_team`, which predictions may have moved since (see there)."""
        return frozenset(team for team, last in self._team_learned.items() if last > learned)

    @property
    def teams_learned(self) -> int:
        """How many teams' jobs were learned from."""
        return len(self._team_learned)

    def reads_own_team(self, job_id: str, spec: JobSpec) -> bool:
        """Whether what `remaining_s` predicts for the job now is read from its own team's
        samples or ratio only, or from nothing learned: not from the keys and the ratio that
        every team's jobs feed.

        If so, and no job of its team was learned from since some moment, the prediction is
        what it was then: samples and ratios only grow, a team's own keys come before the
        shared ones, and only its jobs feed them, so the key (or ratio) that speaks now spoke
        then, with the same samples, and none spoke then where none speaks now.
        """
        if spec.estimated_runtime_s is not None:
            # The user's estimate, scaled by the team's ratio, else everyone's, else as given.
            own = self._ratios.get(("team", spec.team))
            if own is not None and len(own) >= MIN_SAMPLES:
                return True
            everyone = self._ratios.get(("all",))
            return everyone is None or len(everyone) < MIN_SAMPLES
        samples = self._samples_of(job_id, spec)
        return samples is None or not samples.shared

    # ---------------------------------------------------------------- ask

    def samples_for(self, keys: tuple[Key, ...]) -> Samples | None:
        """The most specific key's samples that may speak, or None."""
        for key in keys:
            found = self._samples.get(key)
            if found is not None and len(found) >= MIN_SAMPLES:
                return found
        return None

    def estimate_ratio(self, team: str) -> float | None:
        """How far the team's estimates were off (ran / estimated), or None: not known yet."""
        known = self._team_ratio.get(team)
        if known is not None and known[0] == self._ratio_changes:
            return known[1]
        ratio = None
        for key in (("team", team), ("all",)):
            found = self._ratios.get(key)
            if found is not None and len(found) >= MIN_SAMPLES:
                ratio = found.median
                break
        self._team_ratio[team] = (self._ratio_changes, ratio)
        return ratio

    def _samples_of(self, job_id: str, spec: JobSpec) -> Samples | None:
        resolved = self._resolved.get(job_id)
        if resolved is not None and resolved[0] == self._generation:
            return resolved[1]
        live = self._live.get(job_id)
        samples = self.samples_for(live.keys if live is not None else keys_of(spec))
        if live is not None:
            self._resolved[job_id] = (self._generation, samples)
        return samples

    def remaining_s(self, job_id: str, spec: JobSpec) -> float | None:
        """How long the job's next (or current) attempt is predicted to hold its GPUs: its
        predicted whole runtime; None: nothing to go by.

        An attempt after a preemption or a failure resumes from a checkpoint of unknown age, so
        what earlier attempts held is not taken off (as a user's estimate counts): an estimate
        too long costs a backfill, one too short delays a reservation.
        """
        if spec.estimated_runtime_s is not None:
            # A given estimate is scaled by its team's ratio: the job's own samples are not
            # read, so they are not resolved (backfill asks this of every job behind a head).
            return _combine(self, spec, None)
        # Asked for every running gang in every cycle: the memo inlined.
        resolved = self._resolved.get(job_id)
        if resolved is not None and resolved[0] == self._generation:
            samples = resolved[1]
        else:
            samples = self._samples_of(job_id, spec)
        if spec.estimated_runtime_s is None and spec.max_runtime_s is None:
            return None if samples is None else samples.predicted
        return _combine(self, spec, samples)

    def beyond_s(self, job_id: str, spec: JobSpec, ran_s: float) -> float | None:
        """An attempt that has held GPUs `ran_s` seconds, past its estimate: how much longer
        jobs like it that ran that long went on; None when none did."""
        samples = self._samples_of(job_id, spec)
        if samples is None:
            return None
        known = self._longer.get(job_id)
        if (
            known is not None
            and known[0] is samples
            and known[1] == samples.changes
            and known[2] <= ran_s < known[3]
        ):
            longer = known[4]  # the same samples, the same ones at or below ran_s: the same
        else:
            longer, low, high = samples.above(ran_s)
            if job_id in self._live:
                self._longer[job_id] = (samples, samples.changes, low, high, longer)
        return None if longer is None else max(MIN_REMAINING_S, longer - ran_s)


def _longest(samples: Samples) -> float:
    # A bound is learned only at or past every run a key knows: one below the longest would
    # lower what a gang that ran past it is said to run on (`beyond_s`, the quantile of the
    # runs longer than it has run), though the cancelled job would have run at least as long.
    return samples.ordered[-1]


def _median(samples: Samples) -> float:
    return samples.median


def _raising(
    known: dict[Key, Samples],
    general_first: tuple[Key, ...],
    bound: float,
    prior: float | None,
    speaks_of: Callable[[Samples], float],
) -> tuple[Key, ...]:
    """The keys of `general_first` (from the most general to the most specific) that a lower
    bound `bound` raises: a key that predicts (`MIN_SAMPLES`), where the bound is at least what
    it says (`speaks_of`: a runtime's longest, a ratio's median); one that does not predict
    yet, where the bound is at least what the nearest more general key that does says (`prior`
    where none does; None: nothing to compare with, not learned). All decided on what was
    known before the bound is added."""
    raised: list[Key] = []
    applies = prior
    for key in general_first:
        samples = known.get(key)
        if samples is not None and len(samples) >= MIN_SAMPLES:
            speaks = speaks_of(samples)
            if bound >= speaks:
                raised.append(key)
            applies = speaks
        elif applies is not None and bound >= applies:
            raised.append(key)
    return tuple(raised)


def _combine(estimates: RuntimeEstimates, spec: JobSpec, samples: Samples | None) -> float | None:
    given = spec.estimated_runtime_s
    if given is not None:
        ratio = estimates.estimate_ratio(spec.team)
        predicted = given if ratio is None else given * ratio
    elif samples is not None:
        predicted = samples.predicted
    else:
        return None
    if spec.max_runtime_s is not None:
        predicted = min(predicted, spec.max_runtime_s)
    return predicted


def predicted_runtime_s(estimates: RuntimeEstimates, spec: JobSpec) -> float | None:
    """The predicted whole runtime of a job of this spec (seconds), or None: no estimate given
    and nothing learned yet. The one prediction every user of estimates reads (reservations,
    backfill, ordering by predicted length)."""
    return _combine(estimates, spec, estimates.samples_for(keys_of(spec)))
