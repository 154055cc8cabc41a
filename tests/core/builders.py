"""Fluent builders and a history-replay harness for the scheduling core's tests.

`a_job().gpus(8).tasks(4)` builds a job spec; `History` is a tiny event log around the real core:
it records every event (the test's and the scheduler's), folds it into a SchedulerState and
feeds it to an Auditor, as the scheduler service does in production.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from typing import Any, Literal, TypeVar

from core import (
    Auditor,
    CycleResult,
    JobStatus,
    SchedulerState,
    SchedulingPolicy,
    parse_cluster_spec,
    schedule,
)
from schemas.base import Event
from schemas.jobs import (
    GANG_RELEASING_EVENTS,
    GangReserved,
    GpuShare,
    JobAdmitted,
    JobCancelRequested,
    JobDeferred,
    JobResumeRequested,
    JobSpec,
    JobSubmitted,
    JobSuspendRequested,
    RankPlacement,
    TaskExited,
    TaskStarted,
    TopologySpec,
)
from schemas.nodes import GpuUnhealthy, NodeDrainRequested, NodeLost, NodeRecovered
from schemas.teams import QueueConfigured, TeamCreated

E = TypeVar("E", bound=Event)
T0 = 1_700_000_000.0
_ids = itertools.count(1)


class JobBuilder:
    def __init__(self, job_id: str | None = None) -> None:
        self.job_id = job_id or f"job-{next(_ids):05d}"
        self._fields: dict[str, Any] = {"name": self.job_id, "team": "team-a"}
        self._topology: dict[str, Any] = {}

    def _set(self, **fields: Any) -> JobBuilder:
        self._fields.update(fields)
        return self

    def gpus(self, per_task: int) -> JobBuilder:
        return self._set(gpus_per_task=per_task)

    def named(self, name: str) -> JobBuilder:
        return self._set(name=name)

    def checkpoint_every(self, interval_s: float | Literal["auto"]) -> JobBuilder:
        return self._set(checkpoint={"interval_s": interval_s})

    def tasks(self, tasks: int) -> JobBuilder:
        return self._set(tasks=tasks)

    def cpus(self, per_task: float) -> JobBuilder:
        return self._set(cpus_per_task=per_task)

    def memory(self, mb_per_task: int) -> JobBuilder:
        return self._set(memory_mb_per_task=mb_per_task)

    def cpu_only(self, cpus_per_task: float) -> JobBuilder:
        """A task of no GPU (preprocessing): `gpus_per_task: 0` and its CPUs."""
        return self._set(gpus_per_task=0, cpus_per_task=cpus_per_task)

    def min_tasks(self, tasks: int) -> JobBuilder:
        return self._set(min_tasks=tasks)

    def team(self, team: str) -> JobBuilder:
        return self._set(team=team)

    def priority(self, name: str) -> JobBuilder:
        return self._set(priority=name)

    def gpu_type(self, name: str) -> JobBuilder:
        return self._set(gpu_type=name)

    def estimate(self, seconds: float) -> JobBuilder:
        return self._set(estimated_runtime_s=seconds)

    def max_runtime(self, seconds: float) -> JobBuilder:
        return self._set(max_runtime_s=seconds)

    def min_runtime(self, seconds: float) -> JobBuilder:
        return self._set(min_runtime_s=seconds)

    def preemptible(self, flag: bool) -> JobBuilder:
        return self._set(preemptible=flag)

    def retries(self, count: int) -> JobBuilder:
        return self._set(max_retries=count)

    def tp(self, size: int) -> JobBuilder:
        self._topology["tp_size"] = size
        return self

    def require(self, level: str) -> JobBuilder:
        self._topology["require"] = level
        return self

    def prefer(self, level: str) -> JobBuilder:
        self._topology["prefer"] = level
        return self

    def spec(self) -> JobSpec:
        return JobSpec(**self._fields, topology=TopologySpec(**self._topology))


def a_job(job_id: str | None = None) -> JobBuilder:
    return JobBuilder(job_id)


class History:
    """An event log driving the real core: submit, run cycles, play the node agents."""

    def __init__(
        self,
        cluster: str = "16x8:4:2",
        policy: SchedulingPolicy | None = None,
        start: float = T0,
    ) -> None:
        self.policy = policy or SchedulingPolicy()
        self.state = SchedulerState(self.policy)
        self.auditor = Auditor(self.policy)
        self.now = start
        self.log: list[tuple[Event, float]] = []
        self.cycles: list[CycleResult] = []
        for node in parse_cluster_spec(cluster):
            self.record(node)

    # ------------------------------------------------------------ the log

    def record(self, event: Event, at: float | None = None) -> None:
        when = self.now if at is None else at
        self.auditor.observe(event, len(self.log), when, None)
        self.log.append((event, when))
        self.state.apply(event, when)

    def advance(self, seconds: float) -> History:
        self.now += seconds
        return self

    def events(self, kind: type[E], job_id: str | None = None) -> list[E]:
        return [
            e
            for e, _ in self.log
            if isinstance(e, kind) and (job_id is None or getattr(e, "job_id", None) == job_id)
        ]

    def replayed(self) -> SchedulerState:
        """A fresh state folded from the whole log, as a restarted scheduler would build it."""
        state = SchedulerState(self.policy)
        for event, at in self.log:
            state.apply(event, at)
        return state

    # ------------------------------------------------------------ users and admins

    def team(
        self,
        name: str,
        guaranteed: int = 0,
        max_gpus: int | None = None,
        parent: str | None = None,
    ) -> History:
        self.record(
            TeamCreated(
                name=name,
                parent=parent,
                guaranteed_gpus=guaranteed,
                max_gpus=max_gpus,
                token_sha256="0" * 64,
            )
        )
        return self

    def queue(
        self,
        name: str,
        guaranteed: int = 0,
        max_gpus: int | None = None,
        parent: str | None = None,
        weight: float = 1.0,
    ) -> History:
        self.record(
            QueueConfigured(
                name=name,
                parent=parent,
                guaranteed_gpus=guaranteed,
                max_gpus=max_gpus,
                weight=weight,
            )
        )
        return self

    def submit(self, *builders: JobBuilder) -> list[str]:
        ids = []
        for builder in builders:
            spec = builder.spec()
            self.record(JobSubmitted(job_id=builder.job_id, spec=spec, submitted_by="test"))
            self.record(
                JobAdmitted(
                    job_id=builder.job_id, queue=spec.queue or spec.team, priority=spec.priority
                )
            )
            ids.append(builder.job_id)
        return ids

    def cancel(self, job_id: str) -> None:
        self.record(JobCancelRequested(job_id=job_id, by="test"))

    def suspend(self, job_id: str) -> None:
        self.record(JobSuspendRequested(job_id=job_id, by="test"))

    def resume(self, job_id: str) -> None:
        self.record(JobResumeRequested(job_id=job_id, by="test"))

    # ------------------------------------------------------------ the scheduler

    def cycle(self, commit_delay_s: float = 0.0) -> list[Event]:
        """One cycle decided at `now`; its decisions recorded `commit_delay_s` later, as the
        service commits them once the cycle has run (their recorded time is the log's clock)."""
        result = schedule(self.state, self.now)
        self.cycles.append(result)
        for decision in result.decisions:
            self.record(decision, self.now + commit_delay_s)
        return result.decisions

    def run(self, cycles: int = 1, every_s: float = 1.0, agents: bool = True) -> None:
        """Cycles `every_s` apart; with agents on, every reserved gang starts right away and
        the ranks of every released gang are stopped (as the node agents do)."""
        for _ in range(cycles):
            decisions = self.cycle()
            if agents:
                self.stop_released(decisions)
                self.start_all()
            self.advance(every_s)

    def stop_released(self, decisions: Iterable[Event]) -> None:
        """The agents stop the ranks still running of every gang a decision released."""
        released = {
            (e.job_id, getattr(e, "attempt", None))
            for e in decisions
            if isinstance(e, GANG_RELEASING_EVENTS)
        }
        if not released:
            return
        running: dict[tuple[str, int, int], str] = {}
        for event, _ in self.log:
            if isinstance(event, TaskStarted):
                running[(event.job_id, event.attempt, event.rank)] = event.node_id
            elif isinstance(event, TaskExited):
                running.pop((event.job_id, event.attempt, event.rank), None)
        for (job_id, attempt, rank), node_id in running.items():
            if (job_id, attempt) in released or (job_id, None) in released:
                self.record(
                    TaskExited(
                        job_id=job_id,
                        attempt=attempt,
                        rank=rank,
                        node_id=node_id,
                        exit_code=-9,
                        reason="stopped",
                    )
                )

    # ------------------------------------------------------------ node agents and hardware

    def occupy(self, node_id: str, gpus: int, builder: JobBuilder | None = None) -> str:
        """A running gang of `gpus` GPUs on `node_id`, bound as a scheduler would record it.

        A fixture for scenarios where the layout of the busy GPUs is the point: the job is
        submitted and admitted, and its GangReserved names the node's lowest free GPUs.
        """
        builder = (builder or a_job().preemptible(False).estimate(86400.0)).gpus(gpus)
        job_id = self.submit(builder)[0]
        view = self.state.node(node_id)
        assert view is not None, f"no node {node_id}"
        held = {g for job in self.state.jobs() for g in job.placement.get(node_id, [])}
        free = [g for g in range(view.gpus) if g not in held and g not in view.unhealthy_gpus]
        assert len(free) >= gpus, f"node {node_id} has only {len(free)} free GPUs"
        attempt = self.job(job_id).attempt + 1
        self.record(
            GangReserved(
                job_id=job_id,
                attempt=attempt,
                ranks=[RankPlacement(rank=0, node_id=node_id, gpus=free[:gpus])],
            )
        )
        self.start(job_id)
        return job_id

    def gang(self, job_id: str) -> GangReserved:
        return self.events(GangReserved, job_id)[-1]

    def start(self, job_id: str) -> None:
        gang = self.gang(job_id)
        for rank in gang.ranks:
            self.record(
                TaskStarted(
                    job_id=job_id, attempt=gang.attempt, rank=rank.rank, node_id=rank.node_id
                )
            )

    def start_all(self) -> None:
        for view in list(self.state.jobs()):
            if view.state == "reserved":
                self.start(view.job_id)

    def exit(
        self,
        job_id: str,
        code: int = 0,
        ranks: Iterable[int] | None = None,
        reason: str | None = None,
    ) -> None:
        gang = self.gang(job_id)
        chosen = set(ranks) if ranks is not None else {r.rank for r in gang.ranks}
        for rank in gang.ranks:
            if rank.rank in chosen:
                self.record(
                    TaskExited(
                        job_id=job_id,
                        attempt=gang.attempt,
                        rank=rank.rank,
                        node_id=rank.node_id,
                        exit_code=code,
                        reason=reason,
                    )
                )

    def evict(self, job_id: str, ranks: Iterable[int] | None = None) -> None:
        """The agents stop the ranks of a gang under eviction once their checkpoint is written."""
        self.exit(job_id, 0, ranks, reason="preempted")

    def lose(self, node_id: str) -> None:
        self.record(NodeLost(node_id=node_id, reason="no heartbeat"))

    def recover(self, node_id: str) -> None:
        self.record(NodeRecovered(node_id=node_id))

    def drain(self, node_id: str) -> None:
        self.record(NodeDrainRequested(node_id=node_id, reason="ecc errors", by="health"))

    def break_gpu(self, node_id: str, gpu: int) -> None:
        self.record(GpuUnhealthy(node_id=node_id, gpu_index=gpu, reason="xid 79"))

    # ------------------------------------------------------------ reading

    def job(self, job_id: str) -> JobStatus:
        view = self.state.job(job_id)
        assert view is not None, f"no job {job_id}"
        return view

    def bound_gpus(self, job_id: str) -> int:
        return sum(len(gpus) for gpus in self.job(job_id).placement.values())

    def deferrals(self, job_id: str) -> list[JobDeferred]:
        return self.events(JobDeferred, job_id)


def share_on(job_id: str, node: str, gpu: int, thousandths: int) -> GangReserved:
    """A one-rank gang holding `thousandths` of an MPS-shared GPU."""
    return GangReserved(
        job_id=job_id,
        attempt=1,
        ranks=[
            RankPlacement(
                rank=0,
                node_id=node,
                gpus=[gpu],
                share=GpuShare(thousandths=thousandths, sharing="mps"),
            )
        ],
    )
