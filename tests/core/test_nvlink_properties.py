"""NVLink, as a property: on fleets that mix nodes with and without NVLink (of one GPU type and
of two), with random work (tp groups inside a task and across tasks, plain gangs, elastic ones,
`require`, GPU types, priorities that preempt), nodes lost, recovered, drained, re-registered
with NVLink flipped and PCIe boxes joining late, after every cycle:

- the auditor finds nothing: no tp group bound to a node whose GPUs NVLink does not join at
  its binding (rule `topology`), no preemption while idle GPUs could have served (its model of
  placement pools must be the core's), every promise of DESIGN §3;
- a fresh fold of the log gives the same jobs as the live state (the reshape on the first
  PCIe box is part of the fold, not of the order events came in).
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from core.shape import needs_nvlink
from schemas.jobs import GangReserved
from schemas.nodes import NodeRegistered
from tests.core.builders import History, a_job

FLEET = """
groups:
  - {count: 2, gpus: 8, gpu_type: H100, rack: r0, block: b0}
  - {count: 1, gpus: 4, gpu_type: H100, rack: r1, block: b0}
  - {count: 2, gpus: 8, gpu_type: H100, rack: r1, block: b0, nvlink: false}
  - {count: 1, gpus: 4, gpu_type: A100, rack: r2, block: b0, nvlink: false}
"""
PRIORITIES = ("production", "research", "best-effort")


@st.composite
def jobs(draw: st.DrawFn) -> tuple[str, dict[str, Any]]:
    gpus = draw(st.sampled_from([1, 2, 4, 8]))
    tp = draw(st.sampled_from([None, 1, gpus, gpus * 2, gpus // 2 or 1]))
    return "submit", {
        "gpus": gpus,
        "tp": tp,
        "tasks": draw(st.integers(1, 3)),
        "min_tasks": draw(st.sampled_from([None, 1])),
        "require": draw(st.sampled_from(["none", "none", "node", "rack"])),
        "gpu_type": draw(st.sampled_from([None, None, "H100", "A100"])),
        "priority": draw(st.sampled_from(PRIORITIES)),
        "estimate": draw(st.sampled_from([60.0, 600.0, 3600.0])),
    }


NODE_IDS = ["n0000", "n0001", "n0002", "n0003", "n0004", "n0005"]
steps = st.one_of(
    jobs(),
    st.tuples(st.just("run"), st.integers(1, 3)),
    st.tuples(st.just("advance"), st.sampled_from([30, 300, 3600])),
    st.tuples(st.just("finish"), st.integers(0, 50)),
    st.tuples(st.just("lose"), st.sampled_from(NODE_IDS)),
    st.tuples(st.just("recover"), st.sampled_from(NODE_IDS)),
    st.tuples(st.just("drain"), st.sampled_from(NODE_IDS)),
    st.tuples(st.just("flip"), st.sampled_from(NODE_IDS)),
    st.tuples(st.just("late_box"), st.integers(0, 3)),
)


def _submit(history: History, fields: dict[str, Any]) -> None:
    builder = (
        a_job()
        .gpus(int(fields["gpus"]))
        .tasks(int(fields["tasks"]))
        .priority(str(fields["priority"]))
        .estimate(float(fields["estimate"]))
        .require(str(fields["require"]))
    )
    if fields["tp"] is not None:
        builder = builder.tp(int(fields["tp"]))
    if fields["min_tasks"] is not None:
        builder = builder.min_tasks(int(fields["min_tasks"]))
    if fields["gpu_type"] is not None:
        builder = builder.gpu_type(str(fields["gpu_type"]))
    try:
        builder.spec()
    except ValidationError:
        return
    history.submit(builder)


def _registration(history: History, node_id: str) -> NodeRegistered | None:
    found = [e for e in history.events(NodeRegistered) if e.node_id == node_id]
    return found[-1] if found else None


def _apply(history: History, step: tuple[str, Any], late: list[int]) -> None:
    kind, arg = step
    if kind == "submit":
        _submit(history, arg)
    elif kind == "run":
        history.run(int(arg))
    elif kind == "advance":
        history.advance(float(arg))
    elif kind == "finish":
        running = sorted(job.job_id for job in history.state.jobs() if job.state == "running")
        if running:
            history.exit(running[int(arg) % len(running)], 0)
    elif kind in ("lose", "recover", "drain"):
        view = history.state.node(str(arg))
        if view is None:
            return
        lost = view.state == "lost"
        if kind == "lose" and not lost:
            history.lose(str(arg))
        elif kind == "recover" and lost:
            history.recover(str(arg))
        elif kind == "drain" and not lost:
            history.drain(str(arg))
    elif kind == "flip":
        known = _registration(history, str(arg))
        if known is not None:
            history.record(known.model_copy(update={"nvlink": not known.nvlink}))
    elif kind == "late_box":
        late.append(1)
        [box] = [e for e in history.events(NodeRegistered) if e.node_id == "n0003"][:1]
        name = f"late-{len(late)}"
        history.record(box.model_copy(update={"node_id": name, "hostname": name}))


def _views(history: History) -> list[tuple[object, ...]]:
    return sorted(
        (job.job_id, job.state, job.reason_code, str(job.placement)) for job in history.state.jobs()
    )


# Preemptions with idle PCIe boxes beside are rare among random scripts: more, longer ones.
@settings(max_examples=400)
@given(st.lists(steps, min_size=10, max_size=40))
def test_no_tp_group_on_pcie_and_the_auditor_agrees_with_the_core(
    script: list[tuple[str, Any]],
) -> None:
    history = History(FLEET)
    late: list[int] = []
    for step in script:
        _apply(history, step, late)
        history.run()
        messages = [f"{v.rule}: {v.message}" for v in history.auditor.violations]
        assert messages == []
    # Every tp gang the core bound went to nodes NVLink joined when it was bound.
    nvlink: dict[str, bool] = {}
    specs = {job.job_id: job for job in history.state.jobs()}
    for event, _ in history.log:
        if isinstance(event, NodeRegistered):
            nvlink[event.node_id] = event.nvlink
        elif isinstance(event, GangReserved):
            record = history.state.job_records[event.job_id]
            assert record.spec is not None and event.job_id in specs
            if needs_nvlink(record.spec):
                assert all(nvlink[rank.node_id] for rank in event.ranks)
    replayed = history.replayed()
    assert sorted(
        (job.job_id, job.state, job.reason_code, str(job.placement)) for job in replayed.jobs()
    ) == _views(history)
