"""Properties over random clusters, job streams and failures: the invariants hold after every
cycle, and the same input always gives the same decisions."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core import SchedulingPolicy, schedule
from schemas.base import Event
from tests.core.builders import History, a_job

TEAMS = ("alpha", "beta", "gamma")
PRIORITIES = ("inference-critical", "production", "research", "best-effort")


@dataclass(frozen=True)
class Submit:
    gpus: int
    tasks: int
    min_tasks: int | None
    tp: bool
    team: str
    priority: str
    estimate: float
    require: str
    count: int


@dataclass(frozen=True)
class Exit:
    pick: int
    code: int


@dataclass(frozen=True)
class Hardware:
    kind: str
    pick: int


@dataclass(frozen=True)
class Request:
    kind: str
    pick: int


@dataclass(frozen=True)
class Wait:
    seconds: float


submits = st.builds(
    Submit,
    gpus=st.sampled_from([1, 2, 4, 8]),
    tasks=st.integers(1, 4),
    min_tasks=st.none() | st.just(1),
    tp=st.booleans(),
    team=st.sampled_from(TEAMS),
    priority=st.sampled_from(PRIORITIES),
    estimate=st.sampled_from([60.0, 600.0, 3600.0]),
    require=st.sampled_from(["none", "none", "rack", "node"]),
    count=st.integers(1, 5),
)
operations = st.lists(
    st.one_of(
        submits,
        submits,
        st.builds(Exit, pick=st.integers(0, 50), code=st.sampled_from([0, 0, 0, 1])),
        st.builds(
            Hardware,
            kind=st.sampled_from(["lose", "recover", "drain", "gpu"]),
            pick=st.integers(0, 50),
        ),
        st.builds(
            Request, kind=st.sampled_from(["cancel", "suspend", "resume"]), pick=st.integers(0, 50)
        ),
        st.builds(Wait, seconds=st.sampled_from([1.0, 30.0, 200.0, 4000.0])),
    ),
    min_size=1,
    max_size=40,
)
clusters = st.sampled_from(["2x8:2:1", "4x8:2:2", "6x4:3:1", "8x8:4:2", "3x8:1:3"])
policies = st.sampled_from(
    [
        SchedulingPolicy(),
        SchedulingPolicy(name="fifo"),
        SchedulingPolicy(backfill=False),
        SchedulingPolicy(preemption=False),
    ]
)


def play(cluster: str, policy: SchedulingPolicy, ops: list[object]) -> History:
    """Run the scenario, checking the invariants after every settled cycle."""
    history = History(cluster, policy=policy)
    history.team("alpha", guaranteed=8, max_gpus=None)
    history.team("beta", guaranteed=8, max_gpus=24)
    history.team("gamma", guaranteed=0)
    nodes = [view.node_id for view in history.state.nodes()]
    for number, op in enumerate(ops):
        jobs = [view.job_id for view in history.state.jobs()]
        if isinstance(op, Submit):
            for copy in range(op.count):  # a burst: several jobs placed in one cycle
                builder = (
                    a_job(f"p{number:03d}-{copy}")
                    .gpus(op.gpus)
                    .tasks(op.tasks)
                    .team(op.team)
                    .priority(op.priority)
                    .estimate(op.estimate)
                    .require(op.require)
                )
                if op.min_tasks is not None:
                    builder.min_tasks(op.min_tasks)
                if op.tp and op.gpus * 2 <= 8 and op.tasks % 2 == 0:
                    builder.tp(op.gpus * 2)
                history.submit(builder)
        elif isinstance(op, Exit):
            running = [v.job_id for v in history.state.jobs() if v.state == "running"]
            if running:
                history.exit(running[op.pick % len(running)], op.code)
        elif isinstance(op, Hardware):
            node = nodes[op.pick % len(nodes)]
            if op.kind == "lose":
                history.lose(node)
            elif op.kind == "recover":
                history.recover(node)
            elif op.kind == "drain":
                history.drain(node)
            else:
                history.break_gpu(node, op.pick % 4)
        elif isinstance(op, Request) and jobs:
            job = jobs[op.pick % len(jobs)]
            {"cancel": history.cancel, "suspend": history.suspend, "resume": history.resume}[
                op.kind
            ](job)
        elif isinstance(op, Wait):
            # The scheduler runs every few minutes at most while time passes.
            remaining = op.seconds
            while remaining > 300:
                history.advance(300)
                remaining -= 300
                settle(history)
            history.advance(remaining)
        settle(history)
    return history


def settle(history: History) -> None:
    for _ in range(6):
        decisions = history.cycle()
        history.start_all()
        if not decisions:
            break
    assert history.auditor.violations == []
    assert history.auditor.unexplained() == []
    for view in history.state.jobs():
        if view.state in ("pending", "queued"):
            assert view.reason_code and view.reason, view
            assert view.placement == {}
        if view.state in ("reserved", "running", "preempting"):
            assert view.placement
    bound = sum(len(gpus) for v in history.state.jobs() for gpus in v.placement.values())
    assert bound == history.state.allocated_gpus


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cluster=clusters, policy=policies, ops=operations)
def test_invariants_hold_after_every_cycle(
    cluster: str, policy: SchedulingPolicy, ops: list[object]
) -> None:
    play(cluster, policy, ops)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cluster=clusters, policy=policies, ops=operations)
def test_the_same_input_gives_the_same_decisions(
    cluster: str, policy: SchedulingPolicy, ops: list[object]
) -> None:
    first = play(cluster, policy, ops)
    second = play(cluster, policy, ops)

    def decisions(history: History) -> list[Event]:
        return [d for cycle in history.cycles for d in cycle.decisions]

    assert decisions(first) == decisions(second)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cluster=clusters, ops=operations)
def test_a_replayed_state_equals_the_live_one(cluster: str, ops: list[object]) -> None:
    history = play(cluster, SchedulingPolicy(), ops)

    replayed = history.replayed()

    assert list(replayed.jobs()) == list(history.state.jobs())
    assert list(replayed.nodes()) == list(history.state.nodes())


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cluster=clusters, ops=operations)
def test_a_replayed_state_decides_as_the_live_one(cluster: str, ops: list[object]) -> None:
    # The live state's placement index has a history of its own (kept between cycles); the
    # replayed one is built fresh. Both must decide the next cycle alike.
    history = play(cluster, SchedulingPolicy(), ops)
    history.submit(*(a_job().gpus(gpus) for gpus in (1, 2, 4, 8)))

    replayed = history.replayed()

    assert (
        schedule(replayed, history.now).decisions == schedule(history.state, history.now).decisions
    )
