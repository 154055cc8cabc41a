"""Dependencies between jobs (Slurm's afterok / afterany / afternotok), as pure rules.

A job that `depends_on` others waits until every condition holds, and is cancelled as soon as
one can no longer hold:

| condition   | holds when the job it names … | can no longer hold when it …        |
|-------------|-------------------------------|-------------------------------------|
| `succeeded` | succeeded                     | failed, was cancelled or rejected   |
| `finished`  | reached any terminal state    | (never)                             |
| `failed`    | failed                        | succeeded, was cancelled or rejected |

A job the state does not know (yet) is waited for: the API only lets existing jobs, or jobs of
the same request, be named, so an unknown one is a submission not folded yet.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from schemas.jobs import TERMINAL_STATES, Dependency, DependencyCondition, JobState

VerdictKind = Literal["met", "waiting", "broken"]


@dataclass(frozen=True, slots=True)
class Verdict:
    kind: VerdictKind
    # What a person reads in `why` (waiting) or in the cancellation's reason (broken).
    message: str = ""


MET = Verdict("met")


def condition_verdict(condition: DependencyCondition, state: JobState | None) -> VerdictKind:
    """Whether one condition holds, may still hold, or never will, given the job's state."""
    if state is None or state not in TERMINAL_STATES:
        return "waiting"
    if condition == "finished":
        return "met"
    if condition == "succeeded":
        return "met" if state == "succeeded" else "broken"
    return "met" if state == "failed" else "broken"


def dependency_verdict(
    depends_on: Sequence[Dependency], state_of: Callable[[str], JobState | None]
) -> Verdict:
    """All conditions together: broken as soon as one is, else waiting while one waits."""
    waiting: list[str] = []
    for dependency in depends_on:
        state = state_of(dependency.job)
        kind = condition_verdict(dependency.condition, state)
        if kind == "broken":
            return Verdict(
                "broken",
                f"dependency can never be satisfied: job {dependency.job} ended {state}, "
                f"this job needed it {dependency.condition}",
            )
        if kind == "waiting":
            # The other job's state is not part of the sentence: a reason is recorded again
            # whenever it changes, and that job's own moves are not news about this one.
            unknown = " (not known yet)" if state is None else ""
            waiting.append(f"{dependency.job} to have {dependency.condition}{unknown}")
    if not waiting:
        return MET
    more = f" and {len(waiting) - 3} more" if len(waiting) > 3 else ""
    return Verdict("waiting", "waiting for job " + "; job ".join(waiting[:3]) + more)


def find_cycle(
    start: Iterable[str], edges: Mapping[str, Sequence[str]] | Callable[[str], Sequence[str]]
) -> list[str] | None:
    """A dependency cycle reachable from `start` (the jobs along it, first repeated last), or
    None. `edges` gives the jobs each job depends on. Iterative, so a deep chain is no risk."""
    follow = edges if callable(edges) else (lambda job: edges.get(job, ()))
    done: set[str] = set()
    for root in start:
        if root in done:
            continue
        path: list[str] = []
        on_path: set[str] = set()
        stack: list[tuple[str, int]] = [(root, 0)]
        while stack:
            job, index = stack.pop()
            if index == 0:
                if job in on_path:
                    return [*path[path.index(job) :], job]
                if job in done:
                    continue
                path.append(job)
                on_path.add(job)
            nexts = follow(job)
            if index < len(nexts):
                stack.append((job, index + 1))
                stack.append((nexts[index], 0))
            else:
                done.add(job)
                on_path.discard(job)
                path.pop()
    return None
