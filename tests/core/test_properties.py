"""Properties over random clusters, queue trees, job streams and failures: after every cycle the
invariants of DESIGN §4 and the scheduling promises of §3 the auditor checks hold, and the same
input always gives the same decisions.

The generators use every spec field the core reads (gpu type, tp groups, require and prefer,
elastic minimums, estimates, minimum and maximum runtimes, non-preemptible jobs, retries) and
every cluster feature (GPU types, racks and blocks of several sizes, parent queues with
guarantees, ceilings and weights, lost nodes, drains, broken GPUs). The number of examples and
the seed come from the hypothesis profile (tests/core/conftest.py): derandomized under CI.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise

from hypothesis import given, settings
from hypothesis import strategies as st

from core import SchedulingPolicy, schedule
from schemas.base import Event
from schemas.jobs import PreemptionRequested
from schemas.nodes import NodeUndrained
from tests.core.builders import History, JobBuilder, a_job

_LAST: list[History] = []
TEAMS = ("alpha", "beta", "gamma", "delta")
PRIORITIES = ("inference-critical", "production", "research", "research", "best-effort")


@dataclass(frozen=True)
class Submit:
    gpus: int
    tasks: int
    min_tasks: int | None
    tp: bool
    team: str
    priority: str
    estimate: float | None
    max_runtime: float | None
    min_runtime: float
    preemptible: bool | None
    retries: int
    gpu_type: str | None
    require: str
    prefer: str
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


@dataclass(frozen=True)
class Tree:
    """Guarantees, ceilings, weights and parents of the teams' queues."""

    guarantees: tuple[int, int, int, int]
    ceilings: tuple[int | None, int | None, int | None, int | None]
    weights: tuple[float, float, float, float]
    parented: tuple[bool, bool, bool, bool]
    org_max: int | None


submits = st.builds(
    Submit,
    gpus=st.sampled_from([1, 2, 4, 8]),
    tasks=st.integers(1, 6),
    min_tasks=st.none() | st.just(1) | st.just(2),
    tp=st.booleans(),
    team=st.sampled_from(TEAMS),
    priority=st.sampled_from(PRIORITIES),
    estimate=st.none() | st.sampled_from([60.0, 600.0, 3600.0, 20000.0]),
    max_runtime=st.none() | st.sampled_from([900.0, 7200.0]),
    min_runtime=st.sampled_from([0.0, 0.0, 300.0, 5000.0]),
    preemptible=st.sampled_from([None, None, True, False]),
    retries=st.integers(0, 2),
    gpu_type=st.sampled_from([None, None, "H100", "A100"]),
    require=st.sampled_from(["none", "none", "node", "rack", "block"]),
    prefer=st.sampled_from(["none", "rack", "block"]),
    count=st.integers(1, 4),
)
operations = st.lists(
    st.one_of(
        submits,
        submits,
        submits,
        st.builds(Exit, pick=st.integers(0, 50), code=st.sampled_from([0, 0, 0, 1])),
        st.builds(
            Hardware,
            kind=st.sampled_from(["lose", "recover", "drain", "undrain", "gpu"]),
            pick=st.integers(0, 50),
        ),
        st.builds(
            Request, kind=st.sampled_from(["cancel", "suspend", "resume"]), pick=st.integers(0, 50)
        ),
        st.builds(Wait, seconds=st.sampled_from([1.0, 30.0, 200.0, 1000.0, 4000.0])),
    ),
    min_size=12,
    max_size=60,
)
trees = st.builds(
    Tree,
    guarantees=st.tuples(*(st.sampled_from([0, 0, 4, 8, 16]) for _ in TEAMS)),
    ceilings=st.tuples(*(st.sampled_from([None, None, 16, 32]) for _ in TEAMS)),
    weights=st.tuples(*(st.sampled_from([1.0, 1.0, 2.0, 4.0]) for _ in TEAMS)),
    parented=st.tuples(*(st.booleans() for _ in TEAMS)),
    org_max=st.none() | st.sampled_from([16, 32]),
)
_MIXED = (
    "groups:\n"
    "- {{count: {h}, gpus: 8, gpu_type: H100, rack_size: {rack}, racks_per_block: 2}}\n"
    "- {{count: {a}, gpus: {agpus}, gpu_type: A100, rack_size: {rack}, racks_per_block: 2}}\n"
)
clusters = st.sampled_from(
    [
        "2x8:2:1",
        "4x8:2:2",
        "6x4:3:1",
        "8x8:4:2",
        "3x8:1:3",
        "12x8:2:3",
        "16x8:4:2",
        _MIXED.format(h=4, a=4, agpus=8, rack=2),
        _MIXED.format(h=6, a=3, agpus=4, rack=3),
        _MIXED.format(h=8, a=4, agpus=8, rack=4),
    ]
)
policies = st.sampled_from(
    [
        SchedulingPolicy(),
        SchedulingPolicy(),
        SchedulingPolicy(aging_max_wait_s=1800.0, hysteresis_s=120.0),
        SchedulingPolicy(name="fifo"),
        SchedulingPolicy(backfill=False),
        SchedulingPolicy(preemption=False),
    ]
)


def configure(history: History, tree: Tree) -> None:
    """Teams under an optional org; guarantees that fit the cluster and, under the org, its
    ceiling (else invariant 4 is moot: the API refuses such trees, core/queue_rules.py)."""
    capacity = history.state.allocated_gpus + history.state.free_gpus
    promised = 0
    in_org = 0
    guarantees: list[int] = []
    for guarantee, parented in zip(tree.guarantees, tree.parented, strict=True):
        fits = promised + guarantee <= capacity
        if parented and tree.org_max is not None:
            fits = fits and in_org + guarantee <= tree.org_max
        guarantee = guarantee if fits else 0
        promised += guarantee
        in_org += guarantee if parented else 0
        guarantees.append(guarantee)
    history.queue("org", guaranteed=in_org, max_gpus=tree.org_max)
    for team, guarantee, ceiling, weight, parented in zip(
        TEAMS, guarantees, tree.ceilings, tree.weights, tree.parented, strict=True
    ):
        ceiling = max(ceiling, guarantee) if ceiling is not None else None
        history.team(team, guarantee, ceiling, "org" if parented else None)
        if weight != 1.0:
            history.queue(team, guarantee, ceiling, "org" if parented else None, weight)


def play(cluster: str, policy: SchedulingPolicy, tree: Tree, ops: list[object]) -> History:
    """Run the scenario, checking the invariants after every settled cycle."""
    history = History(cluster, policy=policy)
    _LAST.append(history)
    configure(history, tree)
    nodes = [view.node_id for view in history.state.nodes()]
    for number, op in enumerate(ops):
        if not perform(history, op, f"p{number:03d}", nodes) and isinstance(op, Wait):
            # The scheduler runs every few minutes at most while time passes.
            remaining = op.seconds
            while remaining > 300:
                history.advance(300)
                remaining -= 300
                settle(history)
            history.advance(remaining)
        settle(history)
    return history


def perform(history: History, op: object, prefix: str, nodes: list[str]) -> bool:
    """Record what a generated operation (other than a Wait) does; False for a Wait."""
    jobs = [view.job_id for view in history.state.jobs()]
    if isinstance(op, Submit):
        for copy in range(op.count):  # a burst: several jobs placed in one cycle
            history.submit(job_of(op, f"{prefix}-{copy}"))
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
        elif op.kind == "undrain":
            history.record(NodeUndrained(node_id=node, by="test"))
        else:
            history.break_gpu(node, op.pick % 4)
    elif isinstance(op, Request):
        if jobs:
            job = jobs[op.pick % len(jobs)]
            {"cancel": history.cancel, "suspend": history.suspend, "resume": history.resume}[
                op.kind
            ](job)
    else:
        return False
    return True


def job_of(op: Submit, job_id: str) -> JobBuilder:
    builder = (
        a_job(job_id)
        .gpus(op.gpus)
        .tasks(op.tasks)
        .team(op.team)
        .priority(op.priority)
        .require(op.require)
        .prefer(op.prefer)
        .min_runtime(op.min_runtime)
        .retries(op.retries)
    )
    if op.min_tasks is not None and op.min_tasks <= op.tasks:
        builder.min_tasks(op.min_tasks)
    if op.tp and op.gpus * 2 <= 8 and op.tasks % 2 == 0:
        builder.tp(op.gpus * 2)
    if op.max_runtime is not None:
        builder.max_runtime(op.max_runtime)
    if op.estimate is not None and (op.max_runtime is None or op.estimate <= op.max_runtime):
        builder.estimate(op.estimate)
    if op.preemptible is not None:
        builder.preemptible(op.preemptible)
    if op.gpu_type is not None:
        builder.gpu_type(op.gpu_type)
    return builder


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


def _examples(share: float) -> settings:
    """A fraction of the profile's examples (the determinism and replay tests play twice)."""
    profile = settings.default
    examples = profile.max_examples if profile is not None else 100
    return settings(max_examples=max(5, int(examples * share)))


@given(cluster=clusters, policy=policies, tree=trees, ops=operations)
def test_invariants_and_policy_promises_hold_after_every_cycle(
    cluster: str, policy: SchedulingPolicy, tree: Tree, ops: list[object]
) -> None:
    play(cluster, policy, tree, ops)


@_examples(0.25)
@given(cluster=clusters, policy=policies, tree=trees, ops=operations)
def test_the_same_input_gives_the_same_decisions(
    cluster: str, policy: SchedulingPolicy, tree: Tree, ops: list[object]
) -> None:
    first = play(cluster, policy, tree, ops)
    second = play(cluster, policy, tree, ops)

    def decisions(history: History) -> list[Event]:
        return [d for cycle in history.cycles for d in cycle.decisions]

    assert decisions(first) == decisions(second)


@_examples(0.25)
@given(cluster=clusters, tree=trees, ops=operations)
def test_a_replayed_state_equals_the_live_one(cluster: str, tree: Tree, ops: list[object]) -> None:
    history = play(cluster, SchedulingPolicy(), tree, ops)

    replayed = history.replayed()

    assert list(replayed.jobs()) == list(history.state.jobs())
    assert list(replayed.nodes()) == list(history.state.nodes())


@_examples(0.25)
@given(cluster=clusters, tree=trees, ops=operations)
def test_a_replayed_state_decides_as_the_live_one(
    cluster: str, tree: Tree, ops: list[object]
) -> None:
    # The live state's placement index has a history of its own (kept between cycles); the
    # replayed one is built fresh. Both must decide the next cycle alike.
    history = play(cluster, SchedulingPolicy(), tree, ops)
    history.submit(*(a_job().gpus(gpus) for gpus in (1, 2, 4, 8)))

    replayed = history.replayed()

    assert (
        schedule(replayed, history.now).decisions == schedule(history.state, history.now).decisions
    )


@_examples(0.25)
@given(cluster=clusters, policy=policies, tree=trees, ops=operations)
def test_no_preemptor_evicts_again_within_its_hysteresis(
    cluster: str, policy: SchedulingPolicy, tree: Tree, ops: list[object]
) -> None:
    """No preempt/resume storm: a job that evicted gangs asks for no more evictions within the
    policy's hysteresis, whatever its reason (a reclaim kept off a head's reserved GPUs whose
    reservation moves every cycle among them: core/reservation.py `kept_off_reserved`); and
    the auditor, which judges every one of those evictions, agreed after every cycle (`play`)."""
    history = play(cluster, policy, tree, ops)

    rounds: dict[str, list[float]] = {}
    for event, at in history.log:
        if isinstance(event, PreemptionRequested) and event.preemptor_job_id is not None:
            times = rounds.setdefault(event.preemptor_job_id, [])
            if not times or times[-1] != at:
                times.append(at)
    for preemptor, times in rounds.items():
        gaps = [later - earlier for earlier, later in pairwise(times)]
        assert all(gap >= policy.hysteresis_s for gap in gaps), (preemptor, times)
