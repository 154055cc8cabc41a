"""Pipelines, arrays, holds and updates as a state machine: random arrays, dependent jobs,
holds and releases, updates, cancels, suspends, resumes and rank exits, driving the real core
with agents that start reserved gangs and stop released ones (sometimes late). After every
step these hold:

- a held job is never given a gang: no GangReserved while it is held;
- an array never has more than `max_parallel` elements on GPUs, a released element whose rank
  has not exited yet counted (core/gating.py);
- after a cycle, a waiting job whose dependency can no longer hold has been cancelled, with
  the reason, and every waiting job has a reason;
- the state folded from the whole log (a restarted scheduler) is the state kept cycle after
  cycle.
"""

from __future__ import annotations

import itertools

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from core.dependencies import dependency_verdict
from schemas.jobs import (
    ArraySpec,
    GangReserved,
    JobAdmitted,
    JobCancelled,
    JobChanges,
    JobHeld,
    JobHoldReleased,
    JobState,
    JobSubmitted,
    JobUpdated,
    TaskExited,
    TaskStarted,
    array_element_id,
)
from tests.core.builders import History
from tests.core.test_pipelines import PipelineJob

WAITING = ("pending", "queued")
HOLDING = ("reserved", "running", "preempting")
CONDITIONS = ("succeeded", "finished", "failed")


class Pipelines(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.history = History("2x8:2:2")
        self.jobs: list[str] = []
        self.arrays: dict[str, tuple[list[str], int]] = {}
        self.ids = itertools.count()
        self.after_cycle = False

    def pick(self, index: int, *states: str) -> str | None:
        chosen = [j for j in self.jobs if not states or self.history.job(j).state in states]
        return chosen[index % len(chosen)] if chosen else None

    # ------------------------------------------------------------ users

    @rule(
        count=st.integers(1, 4),
        max_parallel=st.integers(1, 3),
        gpus=st.sampled_from([1, 4, 8]),
        held=st.booleans(),
    )
    def submit_array(self, count: int, max_parallel: int, gpus: int, held: bool) -> None:
        self.after_cycle = False
        array_id = f"arr{next(self.ids)}"
        builder = PipelineJob(array_id).gpus(gpus)
        builder._set(array=ArraySpec(count=count, max_parallel=max_parallel), hold=held)
        spec = builder.spec()
        elements = []
        for index in range(count):
            job_id = array_element_id(array_id, index)
            self.history.record(
                JobSubmitted(
                    job_id=job_id,
                    spec=spec,
                    submitted_by="test",
                    array_id=array_id,
                    array_index=index,
                )
            )
            elements.append(job_id)
        for job_id in elements:
            self.history.record(JobAdmitted(job_id=job_id, queue=spec.team, priority=spec.priority))
        self.arrays[array_id] = (elements, max_parallel)
        self.jobs.extend(elements)

    @rule(
        gpus=st.sampled_from([1, 8]),
        on=st.lists(
            st.tuples(st.integers(0, 50), st.sampled_from(CONDITIONS)), min_size=1, max_size=3
        ),
        held=st.booleans(),
    )
    def submit_dependent(self, gpus: int, on: list[tuple[int, str]], held: bool) -> None:
        self.after_cycle = False
        if not self.jobs:
            return
        builder = PipelineJob(f"dep{next(self.ids)}")
        builder.gpus(gpus)
        for index, condition in on:
            builder.after(self.jobs[index % len(self.jobs)], condition)
        if held:
            builder.held()
        self.jobs.extend(self.history.submit(builder))

    @rule(index=st.integers(0, 50))
    def hold(self, index: int) -> None:
        self.after_cycle = False
        job = self.pick(index, "pending", "queued", "suspended")
        if job is not None:
            self.history.record(JobHeld(job_id=job, by="test"))

    @rule(index=st.integers(0, 50))
    def release(self, index: int) -> None:
        self.after_cycle = False
        job = self.pick(index)
        if job is not None and self.history.state.job_records[job].held:
            self.history.record(JobHoldReleased(job_id=job, by="test"))

    @rule(
        index=st.integers(0, 50),
        priority=st.sampled_from([None, "production", "research", "best-effort"]),
        estimate=st.sampled_from([None, 60.0, 3600.0]),
    )
    def update(self, index: int, priority: str | None, estimate: float | None) -> None:
        self.after_cycle = False
        job = self.pick(index, "pending", "queued", "suspended")
        if job is not None:
            changes = JobChanges(priority=priority, estimated_runtime_s=estimate)
            self.history.record(JobUpdated(job_id=job, by="test", changes=changes))

    @rule(index=st.integers(0, 50))
    def cancel(self, index: int) -> None:
        self.after_cycle = False
        job = self.pick(index, "pending", "queued", "reserved", "running", "suspended")
        if job is not None:
            self.history.cancel(job)

    @rule(index=st.integers(0, 50))
    def suspend(self, index: int) -> None:
        self.after_cycle = False
        job = self.pick(index, "queued", "reserved", "running")
        if job is not None:
            self.history.suspend(job)

    @rule(index=st.integers(0, 50))
    def resume(self, index: int) -> None:
        self.after_cycle = False
        job = self.pick(index, "suspended")
        if job is not None:
            self.history.resume(job)

    @rule(index=st.integers(0, 50), code=st.sampled_from([0, 1]))
    def ranks_exit(self, index: int, code: int) -> None:
        self.after_cycle = False
        job = self.pick(index, "running")
        if job is not None:
            self.history.exit(job, code)

    # ------------------------------------------------------------ the scheduler and agents

    @rule(seconds=st.sampled_from([1.0, 30.0]), agents=st.booleans())
    def cycle(self, seconds: float, agents: bool) -> None:
        held = {j for j, record in self.history.state.job_records.items() if record.held}
        decisions = self.history.cycle()
        for event in decisions:
            if isinstance(event, GangReserved):
                assert event.job_id not in held, f"held job {event.job_id} was placed"
        if agents:
            self.history.stop_released(decisions)
            self.history.start_all()
        # A quiet point: a cycle that decided nothing (one that requeued a gang leaves it
        # to the next cycle, which the service runs at once).
        self.after_cycle = not decisions
        self.history.advance(seconds)

    @rule()
    def late_agents_catch_up(self) -> None:
        self.history.stop_released(event for event, _ in self.history.log)
        self.history.start_all()
        self.after_cycle = False

    # ------------------------------------------------------------ invariants

    @invariant()
    def no_array_has_more_than_max_parallel_elements_on_gpus(self) -> None:
        on_gpus: set[str] = set()
        for event, _ in self.history.log:
            if isinstance(event, TaskStarted):
                on_gpus.add(f"{event.job_id}/{event.attempt}/{event.rank}")
            elif isinstance(event, TaskExited):
                on_gpus.discard(f"{event.job_id}/{event.attempt}/{event.rank}")
        running = {key.split("/")[0] for key in on_gpus}
        for job, record in self.history.state.job_records.items():
            if record.state in HOLDING:
                running.add(job)
        for elements, max_parallel in self.arrays.values():
            assert len(running.intersection(elements)) <= max_parallel

    @invariant()
    def after_a_cycle_no_waiting_job_has_a_broken_dependency(self) -> None:
        if not self.after_cycle:
            return
        records = self.history.state.job_records

        def state_of(job_id: str) -> JobState | None:
            record = records.get(job_id)
            return None if record is None else record.state

        for record in records.values():
            spec = record.spec
            if record.state == "queued" and spec is not None and spec.depends_on:
                verdict = dependency_verdict(spec.depends_on, state_of)
                assert verdict.kind != "broken", (record.job_id, verdict.message)
        for cancelled in self.history.events(JobCancelled):
            assert cancelled.reason

    @invariant()
    def after_a_cycle_every_waiting_job_has_a_reason(self) -> None:
        if self.after_cycle:
            assert self.history.auditor.unexplained() == []

    @invariant()
    def the_log_keeps_the_invariants(self) -> None:
        assert self.history.auditor.violations == []

    @invariant()
    def a_restarted_scheduler_folds_the_same_state(self) -> None:
        replayed = self.history.replayed()
        assert sorted(replayed.jobs(), key=lambda j: j.job_id) == sorted(
            self.history.state.jobs(), key=lambda j: j.job_id
        )
        for job_id, record in self.history.state.job_records.items():
            other = replayed.job_records[job_id]
            assert (record.held, record.gated, record.priority, record.spec) == (
                other.held,
                other.gated,
                other.priority,
                other.spec,
            )


_PROFILE_EXAMPLES = settings.default.max_examples if settings.default is not None else 80
Pipelines.TestCase.settings = settings(
    max_examples=min(80, _PROFILE_EXAMPLES),
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_pipelines_arrays_and_holds_keep_their_invariants = Pipelines.TestCase
