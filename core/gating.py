"""Between ordering and placement: the waiting jobs that may not start yet, whatever is free.

- a held job waits until released (reason `held`);
- a job whose dependencies have not ended as its conditions need waits (reason `dependency`),
  and one whose conditions can no longer hold is cancelled, with the reason (core/dependencies);
- an array element waits while `max_parallel` elements of its array hold GPUs (reason
  `array_limit`), a released element whose rank has not exited yet included. Elements go to
  placement only as many as the array has room for, first in order first, so that one cycle
  cannot start more than the limit either.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import partial

from core.context import CycleContext, Outcome
from core.dependencies import Verdict, dependency_verdict
from core.state import CoreJob, EndWatch
from core.state_index import StateIndex
from core.surface import PlanningSurface
from schemas.base import Event
from schemas.jobs import JobCancelled, JobEvent, JobFailed, JobState, JobSucceeded
from schemas.reasons import ARRAY_LIMIT, DEPENDENCY, HELD


class DependencyBook(StateIndex[EndWatch]):
    """The dependency verdicts of one state's gated jobs kept between cycles, by its planner.

    A verdict rests only on whether each job it names is known and how it ended: a named job's
    moves between waiting and running change nothing of it. So a verdict is worked out again
    only when a job it names was submitted or ended since (`watch_ends`), or ended in this very
    cycle. Worked out afresh in every cycle, a team's 10,000 waiting jobs of 64 dependencies
    each (within its pending limit) took every cycle, every team's, from 30 to 240 ms of CPU
    (attack6)."""

    __slots__ = ("_dependents", "_verdicts")

    def __init__(self) -> None:
        super().__init__()
        self._verdicts: dict[str, Verdict] = {}
        # A job named in a dependency → the jobs whose kept verdicts name it.
        self._dependents: dict[str, set[str]] = {}

    def sync(self, state: PlanningSurface, now: float, ended: Callable[[], Iterable[str]]) -> None:
        """Up to date with `state` at `now`, and with the jobs `ended` gives (those this cycle
        ended, asked only when a verdict is kept: a busy cycle decides thousands of things)."""
        watch = self._current(state, now)
        if watch is None:
            self._verdicts.clear()
            self._dependents.clear()
            self._bind(state, state.watch_ends(), type(state).unwatch_ends)
            return
        changed, watch.changed = watch.changed, set()
        if not self._verdicts:
            return
        for job_id in changed:
            # A job that ended has no verdict to keep (nor one that only now is known).
            self._verdicts.pop(job_id, None)
        for job_id in (*changed, *ended()):
            self.forget_dependents_of(job_id)

    def forget_dependents_of(self, job_id: str) -> None:
        for dependent in self._dependents.pop(job_id, ()):
            self._verdicts.pop(dependent, None)

    def verdict(self, job: CoreJob, work_out: Callable[[], Verdict]) -> Verdict:
        """The job's kept verdict, else `work_out`'s, kept from now on."""
        verdict = self._verdicts.get(job.job_id)
        if verdict is None:
            verdict = self._verdicts[job.job_id] = work_out()
            assert job.spec is not None
            for dependency in job.spec.depends_on:
                self._dependents.setdefault(dependency.job, set()).add(job.job_id)
        return verdict


def gate(
    ctx: CycleContext, waiting: list[CoreJob], book: DependencyBook | None = None
) -> list[CoreJob]:
    """The jobs of `waiting` (in order) free to be placed now; the others get their reason.
    With `book`, the verdicts kept from earlier cycles that still stand are not worked out
    again (the same verdicts)."""
    jobs = ctx.state.job_records
    ended: dict[str, JobState] | None = None

    def ended_now() -> dict[str, JobState]:
        nonlocal ended
        if ended is None:
            ended = _ended_this_cycle(ctx)
        return ended

    def state_of(job_id: str) -> JobState | None:
        # A job this very cycle ended counts as ended: its dependents need not wait a cycle.
        record = jobs.get(job_id)
        return ended_now().get(job_id, None if record is None else record.state)

    if book is not None:
        book.sync(ctx.state, ctx.now, ended_now)

    room: dict[str, int] | None = None
    ready: list[CoreJob] = []
    for job in waiting:
        if not job.gated:
            ready.append(job)
            continue
        spec = job.spec
        verdict: Verdict | None = None
        if spec is not None and spec.depends_on:
            work_out = partial(dependency_verdict, spec.depends_on, state_of)
            verdict = work_out() if book is None else book.verdict(job, work_out)
        if verdict is not None and verdict.kind == "broken":
            # Cancelled even while held: a hold cannot bring a broken condition back.
            ctx.release(job, JobCancelled(job_id=job.job_id, attempt=None, reason=verdict.message))
            if ended is not None:
                ended[job.job_id] = "cancelled"
            if book is not None:
                book.forget_dependents_of(job.job_id)
            continue
        if job.held:
            # The team's own hold first: it is what must change before anything else matters.
            ctx.outcomes[job.job_id] = Outcome(
                HELD, f"{job.need}; held by request: it is never placed until released"
            )
            continue
        if verdict is not None and verdict.kind == "waiting":
            ctx.outcomes[job.job_id] = Outcome(DEPENDENCY, f"{job.need}; {verdict.message}")
            continue
        limit = spec.array.max_parallel if spec is not None and spec.array is not None else None
        if job.array_id is not None and limit is not None:
            if room is None:
                room = _array_room(ctx)
            left = room.get(job.array_id, limit)
            if left <= 0:
                # Elements ahead of it take the room in the cycle they go to placement,
                # whether or not they fit: none may run yet. One wording whatever the count,
                # so that an array's waiting elements are not each given a new reason (an
                # event apiece) whenever one of its elements starts or ends.
                elements = "element" if limit == 1 else "elements"
                ctx.outcomes[job.job_id] = Outcome(
                    ARRAY_LIMIT,
                    f"{job.need}; array {job.array_id} starts at most {limit} {elements} at "
                    "once (max_parallel): that many hold GPUs or are tried ahead of it",
                )
                continue
            room[job.array_id] = left - 1
        ready.append(job)
    return ready


_ENDINGS: dict[type[Event], JobState] = {
    JobSucceeded: "succeeded",
    JobFailed: "failed",
    JobCancelled: "cancelled",
}


def _ended_this_cycle(ctx: CycleContext) -> dict[str, JobState]:
    ended: dict[str, JobState] = {}
    for decision in ctx.result.decisions:
        state = _ENDINGS.get(type(decision))
        if state is not None and isinstance(decision, JobEvent):
            ended[decision.job_id] = state
    return ended


def _array_room(ctx: CycleContext) -> dict[str, int]:
    """Per array with a parallelism limit: how many more of its elements may hold GPUs. An
    element released while a rank of it still runs (a rank may take its stop timeout to die)
    holds its GPUs on the hardware until that rank exits: it counts until then."""
    state = ctx.state
    jobs = state.job_records
    elements: dict[str, set[str]] = {}
    limits: dict[str, int] = {}

    def count(job: CoreJob) -> None:
        if job.array_id is None or job.spec is None:
            return
        array = job.spec.array
        if array is None or array.max_parallel is None:
            return
        limits[job.array_id] = array.max_parallel
        elements.setdefault(job.array_id, set()).add(job.job_id)

    for job in state.holding_jobs.values():
        if job.job_id not in ctx.released or any(map(job.still_runs, range(len(job.ranks)))):
            count(job)
    nodes = state.node_records
    for index in state.lingering_nodes:
        for job_id, _, _ in nodes[index].lingering:
            lingering = jobs.get(job_id)
            if lingering is not None:
                count(lingering)
    return {array: limits[array] - len(ids) for array, ids in elements.items()}
