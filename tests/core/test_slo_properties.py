"""Property of the inference headroom (core/slo.py): whatever the stream of training, inference
replicas and exits, a cycle that binds a gang of another class (of a queue without guarantee)
leaves the headroom free, but for what inference-critical gangs bound in that same cycle took;
the auditor finds nothing, and a refill never evicts a gang above the blast radius."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given
from hypothesis import strategies as st

from core import SchedulingPolicy
from core.live_sharing import GpuAmount
from schemas.jobs import GangReserved, PreemptionRequested
from tests.core.builders import History, a_job

POLICY = SchedulingPolicy(inference_headroom_gpus=6, inference_max_victim_gpus=4)


@dataclass(frozen=True)
class Train:
    gpus: int
    tasks: int
    priority: str


@dataclass(frozen=True)
class Infer:
    replicas: int


@dataclass(frozen=True)
class Exit:
    pick: int


steps = st.lists(
    st.one_of(
        st.builds(Train, st.sampled_from([1, 2, 4, 8]), st.integers(1, 3),
                  st.sampled_from(["research", "production", "best-effort"])),
        st.builds(Infer, st.integers(1, 4)),
        st.builds(Exit, st.integers(0, 1000)),
    ),
    min_size=1,
    max_size=25,
)  # fmt: skip


@given(steps)
def test_the_headroom_is_only_ever_taken_by_inference(plan: list[Train | Infer | Exit]) -> None:
    history = History("4x8:2:2", POLICY)
    sizes: dict[str, GpuAmount] = {}
    for step in plan:
        if isinstance(step, Train):
            builder = a_job().gpus(step.gpus).tasks(step.tasks).priority(step.priority)
            history.submit(builder.estimate(3600))
        elif isinstance(step, Infer):
            replicas = [
                a_job().gpus(1).priority("inference-critical") for _ in range(step.replicas)
            ]
            history.submit(*replicas)
        else:
            running = sorted(j for j, job in history.state.holding_jobs.items() if job.started_at)
            if running:
                history.exit(running[step.pick % len(running)])
        for job in history.state.holding_jobs.values():
            sizes[job.job_id] = job.bound_gpus
        decisions = history.cycle()
        bound = [d for d in decisions if isinstance(d, GangReserved)]
        inference = sum(
            len(rank.gpus)
            for d in bound
            if history.job(d.job_id).priority == "inference-critical"
            for rank in d.ranks
        )
        others = [d for d in bound if history.job(d.job_id).priority != "inference-critical"]
        if others:
            assert history.state.free_gpus + inference >= POLICY.inference_headroom_gpus
        for decision in decisions:
            if isinstance(decision, PreemptionRequested) and decision.preemptor_job_id is None:
                assert sizes[decision.job_id] <= POLICY.inference_max_victim_gpus
        history.stop_released(decisions)
        history.start_all()
        for job_id, job in list(history.state.holding_jobs.items()):
            if job.state == "preempting":
                history.evict(job_id)
        history.advance(60)
    assert history.auditor.violations == []
