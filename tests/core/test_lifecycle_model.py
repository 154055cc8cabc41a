"""The job lifecycle as a state machine: random submits, cancels, suspends, resumes, rank
failures, lost and recovered nodes, drains and undrains, and queue changes, driving the real
core with agents that start reserved gangs and stop released ones (sometimes late). After every
step the invariants hold, plus those of issue 11:

- no job is preempted by one of equal or lower priority without a fair-share reason;
- every reserved gang has all its ranks started or a launch deadline still pending;
- no GPU hosts ranks of two attempts (the auditor checks it from TaskStarted/TaskExited);
- every waiting job has a reason (the auditor's invariant 5, checked at the end of a step).
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from core import SchedulingPolicy
from schemas.jobs import GangReserved, PreemptionRequested, TaskExited, TaskStarted
from schemas.nodes import NodeDrainRequested, NodeLost, NodeUndrained
from tests.core.builders import History, a_job

PRIORITIES = ("inference-critical", "production", "research", "best-effort")
NODES = [f"n{i:04d}" for i in range(2)]


class Lifecycle(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.history = History(
            "2x8:2:1",
            SchedulingPolicy(preemption_grace_s=30, hysteresis_s=60, launch_timeout_s=120),
        )
        self.history.team("alpha", guaranteed=8).team("beta", guaranteed=4)
        self.jobs: list[str] = []
        self.lost: set[str] = set()

    def pick(self, index: int) -> str | None:
        return self.jobs[index % len(self.jobs)] if self.jobs else None

    # ------------------------------------------------------------ users

    @initialize(
        jobs=st.lists(
            st.tuples(
                st.sampled_from([2, 4, 8]),
                st.integers(1, 2),
                st.sampled_from(["alpha", "beta"]),
                st.sampled_from(PRIORITIES),
            ),
            min_size=3,
            max_size=8,
        )
    )
    def a_busy_cluster(self, jobs: list[tuple[int, int, str, str]]) -> None:
        for gpus, tasks, team, priority in jobs:
            self.submit(gpus, tasks, team, priority, 300.0)
        self.history.run()

    @rule(
        gpus=st.sampled_from([1, 2, 4, 8]),
        tasks=st.integers(1, 3),
        team=st.sampled_from(["alpha", "beta"]),
        priority=st.sampled_from(PRIORITIES),
        estimate=st.sampled_from([30.0, 300.0, 3000.0]),
    )
    def submit(self, gpus: int, tasks: int, team: str, priority: str, estimate: float) -> None:
        job = a_job().gpus(gpus).tasks(tasks).team(team).priority(priority).estimate(estimate)
        self.jobs += self.history.submit(job.retries(2))

    @rule(index=st.integers(0, 50))
    def cancel(self, index: int) -> None:
        job = self.pick(index)
        finished = ("succeeded", "failed", "cancelled", "rejected")
        if job is not None and self.history.job(job).state not in finished:
            self.history.cancel(job)

    @rule(index=st.integers(0, 50))
    def suspend(self, index: int) -> None:
        job = self.pick(index)
        if job is not None and self.history.job(job).state in ("queued", "running"):
            self.history.suspend(job)

    @rule(index=st.integers(0, 50))
    def resume(self, index: int) -> None:
        job = self.pick(index)
        if job is not None and self.history.job(job).state == "suspended":
            self.history.resume(job)

    # ------------------------------------------------------------ ranks and hardware

    @rule(index=st.integers(0, 50), code=st.sampled_from([0, 1, 137]))
    def rank_exits(self, index: int, code: int) -> None:
        job = self.pick(index)
        if job is not None and self.history.job(job).state in ("running", "preempting"):
            self.history.exit(job, code, ranks=[0])

    @rule(index=st.integers(0, 50))
    def evict(self, index: int) -> None:
        job = self.pick(index)
        if job is not None and self.history.job(job).state == "preempting":
            self.history.evict(job)

    @rule(node=st.sampled_from(NODES))
    def lose_node(self, node: str) -> None:
        if node not in self.lost:
            self.lost.add(node)
            self.history.lose(node)

    @rule(node=st.sampled_from(NODES))
    def recover_node(self, node: str) -> None:
        if node in self.lost:
            self.lost.discard(node)
            self.history.recover(node)

    @rule(node=st.sampled_from(NODES))
    def drain(self, node: str) -> None:
        self.history.record(NodeDrainRequested(node_id=node, reason="maintenance", by="admin"))

    @rule(node=st.sampled_from(NODES))
    def undrain(self, node: str) -> None:
        self.history.record(NodeUndrained(node_id=node, by="admin"))

    @rule(guaranteed=st.sampled_from([0, 4, 8]), max_gpus=st.sampled_from([None, 8, 16]))
    def reconfigure_queue(self, guaranteed: int, max_gpus: int | None) -> None:
        if max_gpus is None or max_gpus >= guaranteed:
            self.history.queue("beta", guaranteed=guaranteed, max_gpus=max_gpus)

    # ------------------------------------------------------------ time and the scheduler

    @rule(seconds=st.sampled_from([1.0, 20.0, 200.0]), agents=st.booleans())
    def cycle(self, seconds: float, agents: bool) -> None:
        # Agents off: the cycle's releases are not acted on yet, and reserved gangs wait.
        self.history.run(cycles=1, every_s=seconds, agents=agents)

    @rule()
    def late_agents_catch_up(self) -> None:
        self.history.stop_released(event for event, _ in self.history.log)
        self.history.start_all()

    # ------------------------------------------------------------ invariants

    @invariant()
    def the_log_keeps_the_invariants(self) -> None:
        assert self.history.auditor.violations == []

    @invariant()
    def nobody_is_preempted_by_an_equal_or_lower_priority_without_a_fair_share_reason(
        self,
    ) -> None:
        policy = self.history.policy
        for request in self.history.events(PreemptionRequested):
            if request.preemptor_job_id is None:
                continue  # a drain, a suspend or a max runtime, not another job
            victim = self.history.job(request.job_id)
            preemptor = self.history.job(request.preemptor_job_id)
            higher = (
                policy.priority_class(preemptor.priority).rank
                > policy.priority_class(victim.priority).rank
            )
            assert higher or "reclaiming guaranteed capacity" in request.reason, request

    @invariant()
    def every_reserved_gang_starts_or_has_a_launch_deadline_pending(self) -> None:
        timeout = self.history.policy.launch_timeout_s
        for job in self.history.state.job_records.values():
            if job.state == "reserved":
                assert job.reserved_at is not None
                started = len(job.started_ranks) == len(job.ranks)
                # A cycle acts on the deadline; between cycles the clock may pass it.
                assert started or self.history.now <= job.reserved_at + timeout + 200

    @invariant()
    def no_gpu_hosts_ranks_of_two_attempts(self) -> None:
        """Folded from the log independently of the auditor: ranks started and not exited
        (nor lost with their node), and the GPUs their gang gave them."""
        gpus: dict[tuple[str, int, int], tuple[str, tuple[int, ...]]] = {}
        running: dict[tuple[str, int, int], str] = {}
        for event, _ in self.history.log:
            if isinstance(event, GangReserved):
                for rank in event.ranks:
                    key = (event.job_id, event.attempt, rank.rank)
                    gpus[key] = (rank.node_id, tuple(rank.gpus))
            elif isinstance(event, TaskStarted):
                running[(event.job_id, event.attempt, event.rank)] = event.node_id
            elif isinstance(event, TaskExited):
                running.pop((event.job_id, event.attempt, event.rank), None)
            elif isinstance(event, NodeLost):
                running = {k: n for k, n in running.items() if n != event.node_id}
        holders: dict[tuple[str, int], tuple[str, int]] = {}
        for key in running:
            node, indices = gpus[key]
            for gpu in indices:
                other = holders.setdefault((node, gpu), key[:2])
                assert other == key[:2], f"GPU {gpu} of {node} runs {other} and {key[:2]}"


Lifecycle.TestCase.settings = settings(
    max_examples=80,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_the_job_lifecycle_keeps_its_invariants = Lifecycle.TestCase
