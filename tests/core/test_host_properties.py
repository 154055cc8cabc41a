"""Properties of CPUs and memory as resources: after any sequence of submissions (whole-GPU
gangs with and without host asks, CPU-only gangs), exits, cancels and cycles, no node's bound
tasks ask more CPUs or memory than it declared, the state's per-node totals are the sum of its
ranks' asks, a CPU-only rank holds no GPU, the auditor finds nothing, and a replay agrees."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given
from hypothesis import strategies as st

from core.state import rank_host
from tests.core.builders import History, a_job

CLUSTER = """
rack_size: 2
groups:
  - {count: 3, gpus: 8, cpus: 32, memory_mb: 131072}
  - {count: 2, gpus: 4, cpus: 16, memory_mb: 65536}
"""
DECLARED = {"n0000": (32_000, 131_072), "n0001": (32_000, 131_072), "n0002": (32_000, 131_072),
            "n0003": (16_000, 65_536), "n0004": (16_000, 65_536)}  # fmt: skip


@dataclass(frozen=True)
class Submit:
    gpus: int
    tasks: int
    cpus: float | None
    memory: int | None
    require: str
    priority: str


@dataclass(frozen=True)
class End:
    pick: int
    cancel: bool


Step = Submit | End

submits = st.builds(
    Submit,
    gpus=st.sampled_from([0, 0, 1, 2, 4, 8]),
    tasks=st.integers(1, 4),
    cpus=st.sampled_from([None, 0.5, 1, 4, 8, 12.5, 16, 32]),
    memory=st.sampled_from([None, None, 1024, 16_384, 65_536]),
    require=st.sampled_from(["none", "none", "node", "rack"]),
    priority=st.sampled_from(["production", "research", "best-effort"]),
)
ends = st.builds(End, pick=st.integers(0, 1000), cancel=st.booleans())


def check(history: History) -> None:
    asked: dict[str, list[int]] = {node_id: [0, 0] for node_id in DECLARED}
    for job in history.state.holding_jobs.values():
        cpus, memory = rank_host(job.spec)
        for index, mask in job.ranks:
            node_id = history.state.node_records[index].node_id
            asked[node_id][0] += cpus
            asked[node_id][1] += memory
            if job.spec is not None and job.spec.gpus_per_task == 0:
                assert mask == 0, f"CPU-only job {job.job_id} holds GPUs"
    for node_id, (cpus, memory) in asked.items():
        node = history.state.node_record(node_id)
        assert node is not None
        assert (node.cpus_bound_milli, node.memory_bound_mb) == (cpus, memory)
        assert cpus <= DECLARED[node_id][0], f"{node_id}: {cpus} milli-CPUs bound"
        assert memory <= DECLARED[node_id][1], f"{node_id}: {memory} MB bound"
    assert history.auditor.violations == []


@given(st.lists(st.one_of(submits, submits, ends), min_size=1, max_size=30))
def test_host_resources_are_never_oversubscribed(steps: list[Step]) -> None:
    history = History(CLUSTER)
    for step in steps:
        if isinstance(step, Submit):
            if step.gpus == 0 and step.cpus is None:
                continue  # refused by the spec: a CPU-only task gives its CPUs
            builder = a_job().gpus(step.gpus).tasks(step.tasks).priority(step.priority)
            builder = builder.require(step.require).estimate(600)
            if step.cpus is not None:
                builder = builder.cpus(step.cpus)
            if step.memory is not None:
                builder = builder.memory(step.memory)
            history.submit(builder)
        else:
            holding = sorted(history.state.holding_jobs)
            if holding:
                chosen = holding[step.pick % len(holding)]
                if step.cancel:
                    history.cancel(chosen)
                elif history.job(chosen).state == "running":
                    history.exit(chosen)
        history.run()
        check(history)
    replayed = history.replayed()
    for node in history.state.node_records:
        again = replayed.node_record(node.node_id)
        assert again is not None
        assert (again.cpus_bound_milli, again.memory_bound_mb) == (
            node.cpus_bound_milli,
            node.memory_bound_mb,
        )
