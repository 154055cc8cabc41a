"""What the state keeps per shape for the cycle's sake (core/state.py): jobs of one shape
share one Shape object and its worded need, and a binding's GPU list comes from a table for
nodes of up to 8 GPUs. Each is compared with the value computed afresh, for any input: a
shared or tabled answer must be the answer."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from core import SchedulerState, SchedulingPolicy
from core.shape import describe_need, shape_of
from core.state import bits
from schemas.jobs import JobSpec, JobSubmitted, TopologySpec

T0 = 1_700_000_000.0


@st.composite
def specs(draw: st.DrawFn) -> JobSpec:
    gpus = draw(st.sampled_from([0, 1, 2, 4, 8]))
    tasks = draw(st.integers(min_value=1, max_value=16))
    cpus = draw(st.none() | st.sampled_from([0.5, 1.0, 4.0, 32.0]))
    return JobSpec(
        name="j",
        team=draw(st.sampled_from(["team-a", "team-b"])),
        tasks=tasks,
        gpus_per_task=gpus,
        cpus_per_task=1.0 if gpus == 0 and cpus is None else cpus,
        memory_mb_per_task=draw(st.none() | st.sampled_from([1_024, 64_000])),
        min_tasks=draw(st.none() | st.integers(min_value=1, max_value=tasks)),
        gpu_type=draw(st.none() | st.sampled_from(["h100", "a100"])),
        topology=TopologySpec(
            require=draw(st.sampled_from(["none", "node", "rack", "block"])),
            tp_size=8 if gpus and tasks * gpus % 8 == 0 and draw(st.booleans()) else None,
        ),
    )


@given(st.lists(specs(), min_size=1, max_size=12))
def test_jobs_of_one_shape_share_it_and_its_wording_which_are_their_own(
    submitted: list[JobSpec],
) -> None:
    state = SchedulerState(SchedulingPolicy())
    for number, spec in enumerate(submitted):
        state.apply(
            JobSubmitted(job_id=f"job-{number}", spec=spec, submitted_by="test"), T0 + number
        )

    jobs = [state.job_records[f"job-{number}"] for number in range(len(submitted))]
    for job, spec in zip(jobs, submitted, strict=True):
        # A state that never saw a node without NVLink shapes tp gangs as plain ones.
        assert job.shape == shape_of(spec, pcie_nodes=False)
        assert job.need == describe_need(shape_of(spec))
    for first in jobs:
        for second in jobs:
            if first.shape == second.shape:
                assert first.shape is second.shape


@given(st.integers(min_value=0, max_value=2**20))
def test_the_gpus_of_a_mask_are_its_set_bits_lowest_first(mask: int) -> None:
    listed = bits(mask)

    assert listed == [index for index in range(mask.bit_length()) if mask >> index & 1]
    assert bits(mask) is not listed  # each binding gets a list of its own
