"""The head's plan reads when each running gang ends with the usual case inlined and the
estimate of a gang past it asked once (core/reservation.py `gang_ends`): for running gangs
short of, at and past their estimates, some being preempted, with and without runs learned
to say how long such gangs go on, each end is `estimated_end`'s (the reference, `each=True`).
The same when the ends are read from what a planner's timers keep (core/timers.py
`GangTimers.held_ends`), kept up to date cycle after cycle while gangs come, go, start, are
preempted and runs are learned."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from core.context import CycleContext
from core.cycle import Planner
from core.placement import shape_of
from core.policy import SchedulingPolicy
from core.reactions import react
from core.reservation import gang_ends
from core.timers import GangTimers
from schemas.jobs import JobSucceeded, PreemptionRequested
from tests.core.builders import History, a_job
from tests.core.test_properties import Wait, clusters, perform, policies
from tests.core.test_timers import operations

QUARTER = 900.0
POLICY = SchedulingPolicy(overrun_grace_s=300.0)


@settings(max_examples=150, deadline=None)
@given(
    learned=st.lists(st.integers(min_value=1, max_value=40), min_size=0, max_size=8),
    running=st.lists(
        st.tuples(
            st.integers(min_value=0, max_value=7),
            st.sampled_from([1, 2, 4]),
            st.integers(min_value=1, max_value=40),
            st.integers(min_value=0, max_value=8),
        ),
        max_size=20,
    ),
    preempted=st.lists(st.tuples(st.integers(0, 19), st.integers(0, 8)), max_size=3),
    later=st.integers(min_value=0, max_value=60),
)
def test_each_gangs_end_is_the_estimated_end(
    learned: list[int],
    running: list[tuple[int, int, int, int]],
    preempted: list[tuple[int, int]],
    later: int,
) -> None:
    history = History("8x8:2:2", POLICY)
    timers = GangTimers()

    def kept_ends_agree() -> None:
        """A cycle's reactions bring the timers up to date; the plan reads the ends they
        keep (the gangs this cycle released left out by both)."""
        ctx = CycleContext.start(history.state, history.now)
        react(ctx, timers)
        assert ctx.held_ends is not None
        for head in (a_job().gpus(8), a_job().gpus(8).gpu_type("H100")):
            shape = shape_of(head.spec())
            assert gang_ends(ctx, shape) == gang_ends(ctx, shape, each=True)

    kept_ends_agree()
    # Runs of jobs like the running ones, learned from (they say how long one past its
    # estimate goes on), each as long as it estimated (the team's estimates are not scaled).
    for quarters in learned:
        builder = a_job().named("train").estimate(quarters * QUARTER)
        done = history.occupy("n0000", 1, builder)
        history.advance(quarters * QUARTER)
        history.exit(done)
        history.record(JobSucceeded(job_id=done, attempt=1))
        kept_ends_agree()
    jobs: list[str] = []
    for node, gpus, quarters, gap in running:
        history.advance(gap * QUARTER / 2)
        node_id = f"n{node:04d}"
        view = history.state.node(node_id)
        assert view is not None
        held = sum(len(job.placement.get(node_id, [])) for job in history.state.jobs())
        if held + gpus <= view.gpus:
            builder = (
                a_job()
                .named("train")
                .preemptible(True)
                .estimate(quarters * QUARTER)
                .cpus(gpus)
                .memory(1024 * gpus)
            )
            jobs.append(history.occupy(node_id, gpus, builder))
            kept_ends_agree()
    for which, grace in preempted:
        if which < len(jobs):
            history.record(
                PreemptionRequested(
                    job_id=jobs[which],
                    attempt=history.job(jobs[which]).attempt,
                    preemptor_job_id=None,
                    reason="test",
                    grace_s=grace * QUARTER / 4,
                )
            )
    kept_ends_agree()
    history.advance(later * QUARTER / 2)
    kept_ends_agree()
    ctx = CycleContext.start(history.state, history.now)

    for head in (a_job().gpus(8), a_job().gpus(8).gpu_type("H100")):
        shape = shape_of(head.spec())
        assert gang_ends(ctx, shape) == gang_ends(ctx, shape, each=True)


@given(
    cluster=clusters,
    policy=policies,
    ops=operations,
    starts=st.lists(st.booleans(), min_size=50, max_size=50),
)
def test_the_ends_the_timers_keep_are_each_gangs_estimated_end(
    cluster: str, policy: SchedulingPolicy, ops: list[object], starts: list[bool]
) -> None:
    """Random clusters, policies and job streams (those of the property tests): jobs bound,
    started late or never, exiting (runs learned), lost hardware, cancels, suspends, time."""
    history = History(cluster, policy=policy)
    planner = Planner()
    timers = GangTimers()
    nodes = [view.node_id for view in history.state.nodes()]
    heads = [a_job().gpus(1), a_job().gpus(8).tasks(2), a_job().gpus(4).gpu_type("H100")]
    for number, op in enumerate(ops):
        if not perform(history, op, f"t{number:03d}", nodes) and isinstance(op, Wait):
            history.advance(op.seconds)
        ctx = CycleContext.start(history.state, history.now)
        react(ctx, timers)
        for head in heads:
            shape = shape_of(head.spec())
            assert gang_ends(ctx, shape) == gang_ends(ctx, shape, each=True)
        for decision in planner.schedule(history.state, history.now).decisions:
            history.record(decision)
        if starts[number % len(starts)]:
            history.start_all()
