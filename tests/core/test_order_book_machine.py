"""The order kept between cycles (core/ordering.py `OrderBook`) decides as the order computed
afresh, cycle after cycle, over histories richer than test_order_memo.py's: two planners, one
with the books and one without (`Planner(kept_order=False, kept_verdicts=False)`: the order and
the dependency verdicts, core/gating.py `DependencyBook`), plan every cycle of one state, and
their results (decisions, wake-up, counts, head) must be equal. Between cycles the state moves
in every way that can change a waiting job's place in line: priority updates, holds and
releases, dependencies that end or can no longer hold, arrays bounded by `max_parallel`,
aging, queue guarantees and weights, preemption and its victims' eviction, suspension and
resumption, failures and retries, cancellations, lost and drained nodes and broken GPUs, and
the state pickled and thawed, as a restarted scheduler loads a snapshot."""

from __future__ import annotations

import pickle

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, rule

from core import SchedulerState, SchedulingPolicy
from core.context import CycleContext
from core.cycle import CycleResult, Planner
from core.ordering import order
from core.quota import QuotaBook
from core.reactions import react
from schemas.base import Event
from schemas.jobs import (
    ArraySpec,
    Dependency,
    JobAdmitted,
    JobChanges,
    JobHeld,
    JobHoldReleased,
    JobSubmitted,
    JobUpdated,
    array_element_id,
)
from schemas.nodes import GpuRecovered, NodeUndrained
from tests.core.builders import History, a_job

TEAMS = ("alpha", "beta", "gamma")
CLASSES = ("production", "research", "best-effort", "no-such-class")
NODES = ("n0000", "n0001", "n0002")


def _next_wakeup(ctx: CycleContext) -> float | None:
    return min((moment for moment in ctx.wakeups if moment > ctx.now), default=None)


def _seen(result: CycleResult) -> tuple[object, ...]:
    return (
        result.decisions,
        result.next_wakeup,
        result.considered,
        result.skipped,
        result.head_job_id,
        result.gangs_placed,
        result.tasks_placed,
        result.preemptions,
    )


class KeptAgainstFresh(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.history = History("3x8:1:1")
        self.kept = Planner()
        self.fresh = Planner(kept_order=False, kept_verdicts=False)
        self.arrays = 0

    @initialize(
        aging=st.sampled_from([600.0, 3600.0, 6 * 3600.0]),
        guarantees=st.tuples(*(st.sampled_from([0, 0, 4, 8]) for _ in TEAMS)),
    )
    def start(self, aging: float, guarantees: tuple[int, ...]) -> None:
        self.history = History("3x8:1:1", policy=SchedulingPolicy(aging_max_wait_s=aging))
        for team, guaranteed in zip(TEAMS, guarantees, strict=True):
            self.history.team(team, guaranteed=guaranteed)

    # ------------------------------------------------------------ helpers

    @property
    def state(self) -> SchedulerState:
        return self.history.state

    def _ids(self, *states: str) -> list[str]:
        return sorted(view.job_id for view in self.state.jobs() if view.state in states)

    @staticmethod
    def _nth(ids: list[str], pick: int) -> str | None:
        return ids[pick % len(ids)] if ids else None

    def _record(self, event: Event) -> None:
        self.history.record(event)

    # ------------------------------------------------------------ the scheduler

    @rule(
        agents=st.booleans(),
        evict=st.booleans(),
        every_s=st.sampled_from([0.0, 1.0, 30.0]),
        cycles=st.integers(1, 3),
    )
    def cycle(self, agents: bool, evict: bool, every_s: float, cycles: int) -> None:
        """Cycles of both planners; the agents (when on) start every reserved gang, stop the
        ranks of every released one and, with `evict`, of every gang asked to make room."""
        history = self.history
        for _ in range(cycles):
            self._orders_agree()
            kept = self.kept.schedule(history.state, history.now)
            fresh = self.fresh.schedule(history.state, history.now)
            assert _seen(kept) == _seen(fresh)
            for decision in kept.decisions:
                history.record(decision)
            if agents:
                history.stop_released(kept.decisions)
                history.start_all()
                if evict:
                    for job_id in self._ids("preempting"):
                        history.evict(job_id)
            history.advance(every_s)

    def _orders_agree(self) -> None:
        """The order itself, as the cycle about to run asks it: the kept planner's book
        against every job keyed afresh (a difference that no decision shows yet)."""
        state, now = self.state, self.history.now
        book = self.kept._order_book
        assert book is not None
        kept = CycleContext.start(state, now)
        fresh = CycleContext.start(state, now)
        react(kept, None)
        react(fresh, None)
        by_book = order(kept, QuotaBook(state.queue_records), book)
        afresh = order(fresh, QuotaBook(state.queue_records))
        assert [job.job_id for job in by_book] == [job.job_id for job in afresh]
        assert kept.result.considered == fresh.result.considered
        assert _next_wakeup(kept) == _next_wakeup(fresh)

    @rule(seconds=st.sampled_from([1.0, 600.0, 3600.0]))
    def look_back(self, seconds: float) -> None:
        """Both planners asked at an earlier moment (a scheduler's clock behind the log's
        times, or stepped back): jobs aged later are not aged then. Nothing is recorded."""
        history = self.history
        now = history.now
        history.now = now - seconds
        try:
            self._orders_agree()
            kept = self.kept.schedule(history.state, history.now)
            fresh = self.fresh.schedule(history.state, history.now)
            assert _seen(kept) == _seen(fresh)
        finally:
            history.now = now

    @rule(seconds=st.sampled_from([1.0, 30.0, 599.0, 600.0, 3600.0, 20_000.0]))
    def advance_and_cycle(self, seconds: float) -> None:
        self.history.advance(seconds)
        self.cycle(agents=True, evict=True, every_s=1.0, cycles=1)

    @rule(replay=st.booleans())
    def restart(self, replay: bool) -> None:
        """A restarted scheduler: the state pickled and thawed (a snapshot loaded by a new
        process), or folded again from the whole log under the same policy object. Both
        planners see another state."""
        if replay:
            self.history.state = self.history.replayed()
        else:
            self.history.state = pickle.loads(pickle.dumps(self.state))

    # ------------------------------------------------------------ users

    @rule(
        team=st.sampled_from(TEAMS),
        klass=st.sampled_from(CLASSES),
        gpus=st.sampled_from([1, 2, 4, 8]),
        tasks=st.sampled_from([1, 2]),
        estimate=st.sampled_from([300.0, 3600.0, 86_400.0]),
        held=st.booleans(),
        preemptible=st.sampled_from([None, False]),
        copies=st.integers(1, 3),
        fraction=st.sampled_from([None, None, None, 0.25, 0.5]),
        depends=st.one_of(
            st.none(),
            st.tuples(st.integers(0, 50), st.sampled_from(["succeeded", "finished", "failed"])),
        ),
    )
    def submit(
        self,
        team: str,
        klass: str,
        gpus: int,
        tasks: int,
        estimate: float,
        held: bool,
        preemptible: bool | None,
        copies: int,
        fraction: float | None,
        depends: tuple[int, str] | None,
    ) -> None:
        for _ in range(copies):
            self._submit(team, klass, gpus, tasks, estimate, held, preemptible, fraction, depends)

    def _submit(
        self,
        team: str,
        klass: str,
        gpus: int,
        tasks: int,
        estimate: float,
        held: bool,
        preemptible: bool | None,
        fraction: float | None,
        depends: tuple[int, str] | None,
    ) -> None:
        """A job of whole GPUs, or of a slice of one GPU per task (`fraction`, shared)."""
        job = a_job().team(team).priority(klass).gpus(gpus).tasks(tasks).estimate(estimate)
        job = job.retries(2)._set(preemptible=preemptible)
        if fraction is not None:
            job = job._set(gpus_per_task=0, gpu_fraction=fraction, sharing="mps")
        if held:
            job = job._set(hold=True)
        if depends is not None:
            other = self._nth(sorted(self.state.job_records), depends[0])
            if other is not None:
                job = job._set(depends_on=[Dependency(job=other, condition=depends[1])])
        self.history.submit(job)

    @rule(
        team=st.sampled_from(TEAMS),
        klass=st.sampled_from(CLASSES),
        count=st.integers(2, 4),
        max_parallel=st.sampled_from([None, 1, 2]),
        gpus=st.sampled_from([2, 4, 8]),
    )
    def submit_array(
        self, team: str, klass: str, count: int, max_parallel: int | None, gpus: int
    ) -> None:
        self.arrays += 1
        array_id = f"array-{self.arrays}"
        spec = (
            a_job()
            .team(team)
            .priority(klass)
            .gpus(gpus)
            .retries(1)
            ._set(array=ArraySpec(count=count, max_parallel=max_parallel))
            .spec()
        )
        for index in range(count):
            job_id = array_element_id(array_id, index)
            self._record(
                JobSubmitted(job_id=job_id, spec=spec, submitted_by="test", array_id=array_id)
            )
            self._record(JobAdmitted(job_id=job_id, queue=team, priority=spec.priority))

    @rule(pick=st.integers(0, 50), klass=st.sampled_from(CLASSES))
    def update(self, pick: int, klass: str) -> None:
        job_id = self._nth(self._ids("queued", "pending"), pick)
        if job_id is not None:
            changes = JobChanges(priority=klass, estimated_runtime_s=600.0)
            self._record(JobUpdated(job_id=job_id, by="test", changes=changes))

    @rule(pick=st.integers(0, 50), how=st.sampled_from(["hold", "release", "both"]))
    def hold(self, pick: int, how: str) -> None:
        """Held, released, or held and released between two cycles (its aging clock
        restarts)."""
        if how == "release":
            held = sorted(job.job_id for job in self.state.job_records.values() if job.held)
            job_id = self._nth(held, pick)
            if job_id is not None:
                self._record(JobHoldReleased(job_id=job_id, by="test"))
            return
        job_id = self._nth(self._ids("queued"), pick)
        if job_id is None:
            return
        self._record(JobHeld(job_id=job_id, by="test"))
        if how == "both":
            self.history.advance(1.0)
            self._record(JobHoldReleased(job_id=job_id, by="test"))

    @rule(pick=st.integers(0, 50))
    def cancel(self, pick: int) -> None:
        job_id = self._nth(self._ids("queued", "pending", "running", "suspended"), pick)
        if job_id is not None:
            self.history.cancel(job_id)

    @rule(pick=st.integers(0, 50), resume=st.booleans())
    def suspend(self, pick: int, resume: bool) -> None:
        if resume:
            job_id = self._nth(self._ids("suspended"), pick)
            if job_id is not None:
                self.history.resume(job_id)
            return
        job_id = self._nth(self._ids("queued", "running"), pick)
        if job_id is not None:
            self.history.suspend(job_id)

    @rule(
        team=st.sampled_from(TEAMS),
        guaranteed=st.sampled_from([0, 4, 8, 16]),
        weight=st.sampled_from([1.0, 0.5, 3.0]),
    )
    def configure(self, team: str, guaranteed: int, weight: float) -> None:
        self.history.queue(team, guaranteed=guaranteed, weight=weight)

    # ------------------------------------------------------------ node agents and hardware

    @rule(pick=st.integers(0, 50), code=st.sampled_from([0, 1, 137]), whole=st.booleans())
    def exit(self, pick: int, code: int, whole: bool) -> None:
        """A running gang's ranks exit, all of them or its first (a failing rank)."""
        job_id = self._nth(self._ids("running"), pick)
        if job_id is not None:
            self.history.exit(job_id, code, ranks=None if whole else [0])

    @rule(pick=st.integers(0, 50))
    def evict(self, pick: int) -> None:
        """The agents stop the ranks of a gang asked to make room."""
        job_id = self._nth(self._ids("preempting"), pick)
        if job_id is not None:
            self.history.evict(job_id)

    @rule(
        node=st.sampled_from(NODES),
        what=st.sampled_from(["lose", "recover", "recover", "drain", "undrain", "undrain"]),
    )
    def node(self, node: str, what: str) -> None:
        if what == "lose":
            self.history.lose(node)
        elif what == "recover":
            self.history.recover(node)
        elif what == "drain":
            self.history.drain(node)
        else:
            self._record(NodeUndrained(node_id=node, by="test"))

    @rule(node=st.sampled_from(NODES), gpu=st.integers(0, 7), broken=st.booleans())
    def gpu(self, node: str, gpu: int, broken: bool) -> None:
        if broken:
            self.history.break_gpu(node, gpu)
        else:
            self._record(GpuRecovered(node_id=node, gpu_index=gpu))


KeptAgainstFresh.TestCase.settings = settings(
    max_examples=150,
    stateful_step_count=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
test_the_kept_order_decides_as_the_fresh_one = KeptAgainstFresh.TestCase
