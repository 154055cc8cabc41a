"""The job lifecycle as a state machine: random submits, cancels, suspends, resumes, rank
failures (out of memory among them), lost and recovered nodes, drains and undrains, and queue
changes, driving the real core with agents that start reserved gangs, stop released ones
(sometimes late), checkpoint running gangs and evictions (sometimes failing), and resume a new
attempt from the newest checkpoint that still verifies (as `services.agent.plan` picks it).
After every step these hold:

- the log keeps the auditor's invariants;
- no job is preempted by one of equal or lower priority without a fair-share reason;
- every reserved gang has all its ranks started or a launch deadline still pending;
- no GPU hosts ranks of two attempts (the auditor checks it from TaskStarted/TaskExited; the
  machine folds it again on its own);
- no running gang is stopped for a preemption, a suspend or a drain without a
  PreemptionRequested first (its chance to checkpoint);
- work lost by any preemption or suspend (and by any other end of an attempt) is at most the
  work since the last good checkpoint: a new attempt resumes from the newest one that verifies;
- after a cycle, every waiting job has a reason (the auditor's invariant 5).
"""

from __future__ import annotations

import itertools

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from core import SchedulingPolicy
from schemas.checkpoints import (
    CheckpointCommitted,
    CheckpointCorrupted,
    CheckpointFailed,
    CheckpointShard,
)
from schemas.jobs import (
    GANG_RELEASING_EVENTS,
    GangReserved,
    JobRequeued,
    JobSuspended,
    PreemptionRequested,
    TaskExited,
    TaskStarted,
)
from schemas.nodes import NodeDrainRequested, NodeLost, NodeUndrained
from services.agent.plan import committed_newest_first
from tests.core.builders import History, a_job

PRIORITIES = ("inference-critical", "production", "research", "best-effort")
NODES = [f"n{i:04d}" for i in range(2)]
HOLDING = ("reserved", "running", "preempting")
Attempt = tuple[str, int]


class Work:
    """The work of every attempt, in seconds of running: an attempt resumes at the progress of
    the checkpoint its agent picked and gains a second a second from when all its ranks have
    started until its first rank stops, its node is lost or its gang is released."""

    def __init__(self) -> None:
        self.base: dict[Attempt, float] = {}
        self.ranks: dict[Attempt, int] = {}
        self.started: dict[Attempt, set[int]] = {}
        self.running_since: dict[Attempt, float] = {}
        self.stopped_at: dict[Attempt, float] = {}
        self.nodes: dict[Attempt, set[str]] = {}
        # Committed checkpoints, oldest first: (id, its attempt, work it holds, commit time).
        self.checkpoints: dict[str, list[tuple[str, int, float, float]]] = {}
        self.corrupted: set[str] = set()
        self.current: dict[str, int] = {}

    def at(self, key: Attempt, now: float) -> float:
        """The attempt's work at `now`."""
        since = self.running_since.get(key)
        if since is None:
            return self.base.get(key, 0.0)
        until = min(now, self.stopped_at.get(key, now))
        return self.base[key] + max(0.0, until - since)

    def newest_good(self, job_id: str, before: float) -> float:
        """The work of the last checkpoint committed before `before` that still verifies."""
        good = [
            work
            for checkpoint_id, _, work, at in self.checkpoints.get(job_id, [])
            if at <= before and checkpoint_id not in self.corrupted
        ]
        return good[-1] if good else 0.0

    def stop(self, key: Attempt, at: float) -> None:
        if key in self.base:
            self.stopped_at.setdefault(key, at)

    def running(self, key: Attempt) -> bool:
        return key in self.running_since and key not in self.stopped_at


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
        self.work = Work()
        self.folded = 0
        self.asked: set[Attempt] = set()
        self.stopped_unasked: list[str] = []
        self.lost_work: list[str] = []
        self.after_cycle = False
        self.checkpoints = itertools.count(1)

    def pick(self, index: int, *states: str) -> str | None:
        """The `index`-th job (modulo), among those in one of `states` when any are named."""
        jobs = [j for j in self.jobs if not states or self.history.job(j).state in states]
        return jobs[index % len(jobs)] if jobs else None

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
        self.follow()

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
        job = self.pick(index, "pending", "queued", *HOLDING, "suspended")
        finished = ("succeeded", "failed", "cancelled", "rejected")
        if job is not None and self.history.job(job).state not in finished:
            self.history.cancel(job)
            self.follow()

    @rule(index=st.integers(0, 50))
    def suspend(self, index: int) -> None:
        job = self.pick(index, "queued", "running")
        if job is not None and self.history.job(job).state in ("queued", "running"):
            self.history.suspend(job)
            self.follow()

    @rule(index=st.integers(0, 50))
    def resume(self, index: int) -> None:
        job = self.pick(index, "suspended")
        if job is not None and self.history.job(job).state == "suspended":
            self.history.resume(job)
            self.follow()

    # ------------------------------------------------------------ ranks and hardware

    @rule(index=st.integers(0, 50), code=st.sampled_from([0, 1, 137]))
    def rank_exits(self, index: int, code: int) -> None:
        """Rank 0 ends: done (0), crashed (1) or killed by the OOM killer (137)."""
        job = self.pick(index, "running", "preempting")
        if job is None:
            return
        gang = self.history.gang(job)
        oom = code == 137
        self.history.record(
            TaskExited(
                job_id=job,
                attempt=gang.attempt,
                rank=0,
                node_id=gang.ranks[0].node_id,
                exit_code=code,
                reason="out of memory: killed by the kernel's OOM killer" if oom else None,
                out_of_memory=oom,
            )
        )
        self.follow()

    @rule(index=st.integers(0, 50), ok=st.booleans())
    def checkpoint(self, index: int, ok: bool) -> None:
        """A periodic checkpoint of a running gang: committed, or failed (a shard missing)."""
        job = self.pick(index, "running")
        if job is not None:
            self.write_checkpoint(job, ok)

    @rule(index=st.integers(0, 50), outcome=st.sampled_from(["committed", "failed", "none"]))
    def evict(self, index: int, outcome: str) -> None:
        """The agents checkpoint a gang under eviction (or fail to, or die first), then stop it."""
        job = self.pick(index, "preempting")
        if job is not None and self.history.job(job).state == "preempting":
            if outcome != "none":
                self.write_checkpoint(job, outcome == "committed")
            self.history.evict(job)
            self.follow()

    @rule(index=st.integers(0, 50))
    def corrupt_newest_checkpoint(self, index: int) -> None:
        """A committed shard's bytes flip on disk; the agent finds out when it verifies."""
        job = self.pick(index)
        committed = self.work.checkpoints.get(job or "", [])
        if committed:
            self.work.corrupted.add(committed[-1][0])

    @rule(node=st.sampled_from(NODES))
    def lose_node(self, node: str) -> None:
        if node not in self.lost:
            self.lost.add(node)
            self.history.lose(node)
            self.follow()

    @rule(node=st.sampled_from(NODES))
    def recover_node(self, node: str) -> None:
        if node in self.lost:
            self.lost.discard(node)
            self.history.recover(node)
            self.follow()

    @rule(node=st.sampled_from(NODES))
    def drain(self, node: str) -> None:
        self.history.record(NodeDrainRequested(node_id=node, reason="maintenance", by="admin"))
        self.follow()

    @rule(node=st.sampled_from(NODES))
    def undrain(self, node: str) -> None:
        self.history.record(NodeUndrained(node_id=node, by="admin"))
        self.follow()

    @rule(
        team=st.sampled_from(["alpha", "beta"]),
        guaranteed=st.sampled_from([0, 4, 8]),
        max_gpus=st.sampled_from([None, 8, 16]),
        weight=st.sampled_from([0.5, 1.0, 2.0]),
    )
    def reconfigure_queue(
        self, team: str, guaranteed: int, max_gpus: int | None, weight: float
    ) -> None:
        # Only what the API's validation lets through (core/queue_rules.py): max ≥ guaranteed,
        # guarantees that fit the cluster together.
        other = "beta" if team == "alpha" else "alpha"
        others = self.history.state.queue_records[other].guaranteed_gpus
        if (max_gpus is None or max_gpus >= guaranteed) and guaranteed + others <= 16:
            self.history.queue(team, guaranteed=guaranteed, max_gpus=max_gpus, weight=weight)

    # ------------------------------------------------------------ time and the scheduler

    @rule(
        seconds=st.sampled_from([1.0, 20.0, 200.0]),
        agents=st.booleans(),
        periodic=st.booleans(),
    )
    def cycle(self, seconds: float, agents: bool, periodic: bool) -> None:
        # Agents off: the cycle's releases are not acted on yet, and reserved gangs wait.
        self.history.run(cycles=1, every_s=0.0, agents=agents)
        self.after_cycle = True
        self.follow()
        self.after_cycle = False
        self.history.advance(seconds)
        if periodic:
            # Periodic checkpoints fall due (checkpoint.interval_s): every running gang's.
            for job in self.jobs:
                if self.history.job(job).state == "running":
                    self.write_checkpoint(job, ok=True)

    @rule()
    def late_agents_catch_up(self) -> None:
        self.history.stop_released(event for event, _ in self.history.log)
        self.history.start_all()
        self.follow()

    # ------------------------------------------------------------ the agents' bookkeeping

    def write_checkpoint(self, job: str, ok: bool) -> None:
        """The gang's agents write a checkpoint of its current attempt, if it is running."""
        work = self.work
        attempt = work.current.get(job)
        if attempt is None or not work.running((job, attempt)):
            return
        checkpoint_id = f"a{attempt}-{next(self.checkpoints)}"
        if not ok:
            self.history.record(
                CheckpointFailed(
                    job_id=job, attempt=attempt, checkpoint_id=checkpoint_id, reason="no shard"
                )
            )
            return
        progress = work.at((job, attempt), self.history.now)
        work.checkpoints.setdefault(job, []).append(
            (checkpoint_id, attempt, progress, self.history.now)
        )
        shard = CheckpointShard(rank=0, uri=f"file:///{checkpoint_id}", bytes=1, sha256="0" * 64)
        self.history.record(
            CheckpointCommitted(
                job_id=job,
                attempt=attempt,
                checkpoint_id=checkpoint_id,
                step=int(progress),
                shards=[shard],
            )
        )

    def follow(self) -> None:
        """Fold what the log gained since the last step into the attempts' work."""
        log = self.history.log
        work = self.work
        while self.folded < len(log):
            event, at = log[self.folded]
            self.folded += 1
            if isinstance(event, GangReserved):
                self.resumed(event, at)
            elif isinstance(event, PreemptionRequested):
                self.asked.add((event.job_id, event.attempt))
            elif isinstance(event, TaskStarted):
                key = (event.job_id, event.attempt)
                if key in work.base and key not in work.stopped_at:
                    work.started[key].add(event.rank)
                    if len(work.started[key]) == work.ranks[key]:
                        work.running_since.setdefault(key, at)
            elif isinstance(event, TaskExited):
                work.stop((event.job_id, event.attempt), at)
            elif isinstance(event, NodeLost):
                for key, nodes in work.nodes.items():
                    if event.node_id in nodes:
                        work.stop(key, at)
            elif isinstance(event, GANG_RELEASING_EVENTS):
                attempt = getattr(event, "attempt", None) or work.current.get(event.job_id)
                if attempt is not None:
                    self.released((event.job_id, attempt), event, at)

    def released(self, key: Attempt, event: object, at: float) -> None:
        """A gang stopped for an eviction or a suspend must have been asked to checkpoint."""
        was_running = key in self.work.running_since and key not in self.work.stopped_at
        self.work.stop(key, at)
        evicted = isinstance(event, JobSuspended) or (
            isinstance(event, JobRequeued) and event.code in ("preempted", "node_drained")
        )
        if evicted and was_running and key not in self.asked:
            self.stopped_unasked.append(f"{key} stopped by {event!r} with no checkpoint asked")

    def resumed(self, gang: GangReserved, at: float) -> None:
        """The new attempt's agents pick the newest committed checkpoint that verifies (those
        that do not are recorded as corrupted); the previous attempt's lost work is judged."""
        work = self.work
        job = gang.job_id
        events = [
            e
            for e, _ in self.history.log
            if isinstance(e, CheckpointCommitted | CheckpointCorrupted) and e.job_id == job
        ]
        progress = {c[0]: c[2] for c in work.checkpoints.get(job, [])}
        base = 0.0
        for committed in committed_newest_first(events):
            if committed.checkpoint_id in work.corrupted:
                self.history.record(
                    CheckpointCorrupted(
                        job_id=job,
                        checkpoint_id=committed.checkpoint_id,
                        reason="verified before resume: sha256 differs",
                    )
                )
                continue
            base = progress[committed.checkpoint_id]
            break
        previous = work.current.get(job)
        if previous is not None:
            key = (job, previous)
            stopped = work.stopped_at.get(key, at)
            done = work.at(key, stopped)
            lost = done - base
            since_checkpoint = done - work.newest_good(job, stopped)
            if lost > since_checkpoint + 1e-6:
                self.lost_work.append(
                    f"{key}: {lost:g} s of work lost, {since_checkpoint:g} s since the last "
                    f"good checkpoint (resumed at {base:g})"
                )
        key = (job, gang.attempt)
        work.base[key] = base
        work.ranks[key] = len(gang.ranks)
        work.started[key] = set()
        work.nodes[key] = {rank.node_id for rank in gang.ranks}
        work.current[job] = gang.attempt

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

    @invariant()
    def no_running_gang_is_evicted_or_suspended_without_a_chance_to_checkpoint(self) -> None:
        assert self.stopped_unasked == []

    @invariant()
    def work_lost_is_at_most_the_work_since_the_last_good_checkpoint(self) -> None:
        assert self.lost_work == []

    @invariant()
    def after_a_cycle_every_waiting_job_has_a_reason(self) -> None:
        if self.after_cycle:
            assert self.history.auditor.unexplained() == []


# 80 examples, or fewer where the profile asks for fewer (`mutation`: each mutant's run short).
_PROFILE_EXAMPLES = settings.default.max_examples if settings.default is not None else 80
Lifecycle.TestCase.settings = settings(
    max_examples=min(80, _PROFILE_EXAMPLES),
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_the_job_lifecycle_keeps_its_invariants = Lifecycle.TestCase
