"""Properties of slices and shares in the live cycle: after any sequence of submissions,
cycles (placements and re-partitions), exits and passing time, every GPU's geometry is valid for
its model, no slice or share is double-booked, no GPU is whole and shared at once, a soft-shared
GPU never hosts two teams, the auditor finds nothing, and quotas add up in exact fractions."""

from __future__ import annotations

from fractions import Fraction

from hypothesis import given
from hypothesis import strategies as st

from core.live_sharing import GpuAmount, job_gpus
from tests.core.builders import History, JobBuilder, a_job

TEAMS = ("alpha", "beta", "gamma")
PROFILES = ("1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb")


@st.composite
def clusters(draw: st.DrawFn) -> str:
    lines = ["groups:"]
    for _ in range(draw(st.integers(1, 2))):
        mig = draw(st.sampled_from(["dynamic", "dynamic", "none", "[2g.20gb, 1g.10gb, 3g.40gb]"]))
        lines.append(
            f"  - {{count: {draw(st.integers(1, 2))}, gpus: {draw(st.integers(1, 3))}, "
            f"gpu_type: H100, mig: {mig}, reconfigure_s: {draw(st.sampled_from([0, 60]))}}}"
        )
    return "\n".join(lines) + "\n"


@st.composite
def jobs(draw: st.DrawFn) -> JobBuilder:
    team = draw(st.sampled_from(TEAMS))
    kind = draw(st.sampled_from(["whole", "mig", "mig", "share", "share"]))
    tasks = draw(st.integers(1, 3))
    job = a_job().team(team).tasks(tasks)
    if kind == "whole":
        return job.gpus(draw(st.integers(1, 2)))
    if kind == "mig":
        return job._set(mig_profile=draw(st.sampled_from(PROFILES)), gpus_per_task=0)
    fraction = draw(st.sampled_from([0.125, 0.25, 0.5, 0.333, 0.75]))
    return job._set(
        gpu_fraction=fraction, gpus_per_task=0, sharing=draw(st.sampled_from(["mps", "timeslice"]))
    )


steps = st.one_of(
    st.tuples(st.just("submit"), jobs()),
    st.tuples(st.just("cycle"), st.just(None)),
    st.tuples(st.just("exit"), st.integers(0, 50)),
    st.tuples(st.just("wait"), st.sampled_from([1, 30, 61, 700])),
)


def check(history: History) -> None:
    state = history.state
    ledger = state.sharing.ledger
    assert ledger.problems() == []
    assert history.auditor.violations == []
    for record in state.node_records:
        assert record.bound_mask & record.shared_mask == 0, record.node_id
    total: GpuAmount = 0
    for job in state.holding_jobs.values():
        assert job.spec is not None
        if job.spec.fractional:
            assert job.bound_gpus == job_gpus(job.spec, len(job.ranks))
        total += job.bound_gpus
    assert state.allocated_gpus == total
    assert sum((q.allocated for q in state.queue_records.values()), Fraction(0)) == total
    # One instance, one holder; one soft-shared GPU, one team.
    for node in ledger.nodes.values():
        for gpu in node.gpus:
            assert len({team for _, team in gpu.slices.values()}) <= len(gpu.slices)
            assert len({share.team for share in gpu.shares.values()}) <= 1


@given(clusters(), st.lists(steps, min_size=5, max_size=40))
def test_any_sequence_keeps_every_gpu_valid_and_quotas_exact(
    cluster: str, sequence: list[tuple[str, object]]
) -> None:
    history = History(cluster=cluster)
    for action, argument in sequence:
        if action == "submit" and isinstance(argument, JobBuilder):
            history.submit(argument)
        elif action == "cycle":
            history.run(every_s=0)
        elif action == "exit" and isinstance(argument, int):
            running = sorted(j.job_id for j in history.state.jobs() if j.state == "running")
            if running:
                history.exit(running[argument % len(running)])
        elif isinstance(argument, int):
            history.advance(argument)
        check(history)
    history.run(every_s=0)
    check(history)
