"""A gang's shape and the words `why` opens with (DESIGN §3 Gang, Topology, Explanations).

A job is `tasks` ranks of `gpus_per_task` GPUs; a tensor-parallel group of `tp_size` GPUs never
spans NVLink domains, so when tp is a multiple of gpus_per_task, tp/g consecutive ranks form one
unit that lands on one node; `min_tasks` rounds up to whole units. Every explanation begins with
the need worded from the shape ("needs 8 GPUs in one NVLink domain; earliest at …").
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.shape import Shape, cpus_text, describe_need, shape_of, unit_gpus
from tests.core.builders import JobBuilder, a_job


@pytest.mark.parametrize(
    ("builder", "need"),
    [
        (a_job().gpus(1), "needs 1 GPU"),
        (a_job().gpus(2), "needs 2 GPUs in one NVLink domain"),
        (a_job().gpus(8), "needs 8 GPUs in one NVLink domain"),
        (a_job().gpus(2).tasks(2), "needs 4 GPUs (2 tasks x 2)"),
        (
            a_job().gpus(1).tasks(4).require("node"),
            "needs 4 GPUs (4 tasks x 1) in one NVLink domain",
        ),
        (
            a_job().gpus(8).tasks(8).gpu_type("h100").require("rack"),
            "needs 64 GPUs (8 tasks x 8) of type h100 in one rack",
        ),
        (a_job().gpus(4).tasks(4).require("block"), "needs 16 GPUs (4 tasks x 4) in one block"),
        (a_job().gpus(4).tasks(2).prefer("rack"), "needs 8 GPUs (2 tasks x 4)"),
        (
            a_job().gpus(2).tasks(8).tp(8),
            "needs 16 GPUs (8 tasks x 2), tp groups of 8 GPUs each on one node",
        ),
        (
            a_job().gpus(2).tasks(4).tp(8),
            "needs 8 GPUs (4 tasks x 2) in one NVLink domain, tp groups of 8 GPUs each on one node",
        ),
        (a_job().gpus(1).tasks(8).min_tasks(3), "needs 8 GPUs (8 tasks x 1) (at least 3 tasks)"),
        (
            a_job().gpus(2).tasks(8).tp(4).min_tasks(3),
            "needs 16 GPUs (8 tasks x 2), tp groups of 4 GPUs each on one node (at least 4 tasks)",
        ),
        # What a task asks of its node's host, CPUs as a person writes them.
        (a_job().gpus(1).cpus(1), "needs 1 GPU, 1 CPU per task"),
        (a_job().gpus(1).cpus(0.5), "needs 1 GPU, 0.5 CPUs per task"),
        (a_job().gpus(1).memory(4096), "needs 1 GPU, 4096 MB of memory per task"),
        (
            a_job().gpus(8).cpus(32).memory(64000),
            "needs 8 GPUs in one NVLink domain, 32 CPUs and 64000 MB of memory per task",
        ),
        # A CPU-only gang (preprocessing) is worded in tasks, not GPUs.
        (a_job().cpu_only(1.25), "needs 1 task of 1.25 CPUs, no GPU"),
        (
            a_job().cpu_only(2).tasks(4).memory(4096),
            "needs 4 tasks of 2 CPUs and 4096 MB of memory, no GPU",
        ),
        (
            a_job().cpu_only(1).tasks(2).require("node"),
            "needs 2 tasks of 1 CPU, no GPU, in one node",
        ),
        (
            a_job().cpu_only(8).tasks(4).require("rack").min_tasks(2),
            "needs 4 tasks of 8 CPUs, no GPU, in one rack (at least 2 tasks)",
        ),
        (
            a_job().cpu_only(3).tasks(3).require("block"),
            "needs 3 tasks of 3 CPUs, no GPU, in one block",
        ),
        (a_job().cpu_only(16).tasks(2).prefer("rack"), "needs 2 tasks of 16 CPUs, no GPU"),
    ],
)
def test_every_explanation_opens_with_the_need_worded_from_the_gangs_shape(
    builder: JobBuilder, need: str
) -> None:
    assert describe_need(shape_of(builder.spec())) == need


def test_ranks_of_one_tensor_parallel_group_form_one_unit_on_one_node() -> None:
    # tp 8 over 2-GPU tasks: 4 consecutive ranks share a node; 8 tasks are 2 such units, and a
    # min_tasks of 3 rounds up to one whole unit (a partial tp group is no use); with tp 4 the
    # units are 2 tasks, and 3 tasks round up to 2 units.
    assert shape_of(a_job().gpus(2).tasks(8).tp(8).min_tasks(3).spec()) == Shape(
        gpu_type=None,
        unit_gpus=8,
        tasks_per_unit=4,
        gpus_per_task=2,
        units=2,
        min_units=1,
        require="none",
        nvlink=True,
    )
    assert shape_of(a_job().gpus(2).tasks(8).tp(4).min_tasks(3).spec()).min_units == 2


def test_on_a_cluster_of_nvlink_alone_a_tp_gang_is_the_shape_of_a_plain_one() -> None:
    # Nothing sets them apart there, and one shape shares every per-shape answer of a cycle.
    tp = shape_of(a_job().gpus(8).tasks(2).tp(8).spec(), pcie_nodes=False)

    assert tp == shape_of(a_job().gpus(8).tasks(2).spec(), pcie_nodes=False)
    assert tp != shape_of(a_job().gpus(8).tasks(2).tp(8).spec(), pcie_nodes=True)


@pytest.mark.parametrize(
    ("builder", "unit_gpus", "nvlink"),
    [
        # tp equal to the task's GPUs: one task is a unit, its GPUs joined by NVLink
        (a_job().gpus(4).tasks(2).tp(4), 4, True),
        # tp dividing the task's GPUs fits in one task, and its groups still span GPUs
        (a_job().gpus(4).tasks(2).tp(2), 4, True),
        (a_job().gpus(4).tasks(2).tp(1), 4, False),  # a tp of one GPU talks to no other
        (a_job().gpus(4).tasks(2), 4, False),  # no tp: every task is its own unit, any node
    ],
)
def test_a_tp_group_no_larger_than_a_task_keeps_each_task_its_own_unit(
    builder: JobBuilder, unit_gpus: int, nvlink: bool
) -> None:
    shape = shape_of(builder.spec())

    assert (shape.tasks_per_unit, shape.unit_gpus, shape.units) == (1, unit_gpus, 2)
    assert shape.nvlink is nvlink


def test_a_gang_without_min_tasks_must_be_placed_whole_and_min_tasks_one_is_one_unit() -> None:
    whole = shape_of(a_job().gpus(2).tasks(4).require("rack").gpu_type("a100").spec())
    elastic = shape_of(a_job().gpus(2).tasks(4).min_tasks(1).spec())

    assert whole == Shape(
        gpu_type="a100",
        unit_gpus=2,
        tasks_per_unit=1,
        gpus_per_task=2,
        units=4,
        min_units=4,
        require="rack",
    )
    assert (elastic.min_units, elastic.min_gpus, elastic.gpus) == (1, 2, 8)


@pytest.mark.parametrize(
    ("builder", "gpus"),
    [
        (a_job().gpus(2).tasks(8).tp(8), 8),  # 4 ranks of 2 GPUs share one NVLink domain
        (a_job().gpus(4).tasks(2).tp(2), 4),  # the tp group fits inside one task
        (a_job().gpus(3).tasks(2), 3),
    ],
)
def test_the_gpus_one_unit_needs_in_one_nvlink_domain_count_a_whole_tp_group(
    builder: JobBuilder, gpus: int
) -> None:
    # Admission refuses a job whose unit exceeds the largest node: the unit never spans nodes.
    assert unit_gpus(builder.spec()) == gpus


@pytest.mark.parametrize(
    ("milli", "text"),
    [(1000, "1"), (32_000, "32"), (500, "0.5"), (1250, "1.25"), (1_000_000_000, "1000000")],
)
def test_cpus_are_written_as_a_person_writes_them_never_in_exponent_notation(
    milli: int, text: str
) -> None:
    assert cpus_text(milli) == text


_shapes = st.builds(
    Shape,
    gpu_type=st.sampled_from([None, "h100"]),
    unit_gpus=st.integers(0, 16),
    tasks_per_unit=st.integers(1, 8),
    gpus_per_task=st.integers(0, 8),
    units=st.integers(1, 64),
    min_units=st.integers(1, 64),
    require=st.sampled_from(["none", "node", "rack", "block"]),
    cpus_milli=st.sampled_from([0, 500, 4000]),
    memory_mb=st.sampled_from([0, 1024]),
    nvlink=st.booleans(),
)


@given(shape=_shapes, units=st.integers(1, 64), cpus_milli=st.sampled_from([0, 250]))
def test_a_shapes_kept_least_gpus_and_host_ask_are_those_of_its_fields_after_any_change(
    shape: Shape, units: int, cpus_milli: int
) -> None:
    # `min_gpus` and `asks_host` are worked out once when a shape is made, not on each read:
    # a shape made again with other fields (as the host rules and the host ceilings do) must
    # not keep the old answers.
    for seen in (shape, replace(shape, units=units), replace(shape, cpus_milli=cpus_milli)):
        assert seen.min_gpus == seen.min_units * seen.unit_gpus
        assert seen.asks_host == bool(seen.cpus_milli or seen.memory_mb)
        assert seen == replace(seen)


def _compared(shape: Shape) -> tuple[object, ...]:
    return tuple(getattr(shape, name) for name in _COMPARED)


_COMPARED = (
    "gpu_type",
    "unit_gpus",
    "tasks_per_unit",
    "gpus_per_task",
    "units",
    "min_units",
    "require",
    "cpus_milli",
    "memory_mb",
    "nvlink",
)


@given(
    shape=_shapes,
    other=_shapes,
    units=st.integers(1, 64),
    memory_mb=st.sampled_from([0, 1_024]),
    gpu_type=st.sampled_from([None, "h100", "a100"]),
    nvlink=st.booleans(),
)
def test_a_shapes_kept_hash_and_failure_keys_are_those_of_its_fields_after_any_change(
    shape: Shape, other: Shape, units: int, memory_mb: int, gpu_type: str | None, nvlink: bool
) -> None:
    # The hash and the two failure keys are worked out once when a shape is made (a cycle
    # looks thousands of jobs' shapes up): equal shapes hash alike and unequal ones are
    # told apart as by their fields, whatever was changed to make them.
    changed = [
        replace(shape, units=max(units, shape.min_units)),
        replace(shape, memory_mb=memory_mb),
        replace(shape, gpu_type=gpu_type),
        replace(shape, nvlink=nvlink),
        other,
    ]
    for seen in [shape, *changed]:
        assert hash(seen) == hash(_compared(seen))
        for avoid in (False, True):
            key = seen.failure_key(avoid)
            assert key == (
                seen.gpu_type,
                seen.unit_gpus,
                seen.require,
                avoid,
                seen.cpus_milli,
                seen.memory_mb,
                seen.nvlink,
            )
        for against in [shape, *changed]:
            assert (seen == against) == (_compared(seen) == _compared(against))
            assert ({seen: 1}.get(against) == 1) == (seen == against)


def test_a_shape_pickled_by_another_process_hashes_as_one_made_here() -> None:
    # Scheduler snapshots are pickled by one process and loaded by another, whose string
    # hashes differ: a hash kept from the other process would miss every per-shape answer.
    import pickle
    import subprocess
    import sys

    made = (
        "import pickle, sys\n"
        "from core.shape import Shape\n"
        "shape = Shape('h100', 8, 1, 8, 4, 2, 'rack', 250, 1024, True)\n"
        "sys.stdout.buffer.write(pickle.dumps(shape))\n"
    )
    blob = subprocess.run(
        [sys.executable, "-c", made],
        check=True,
        capture_output=True,
        env={"PYTHONHASHSEED": "12345", "PATH": ""},
    ).stdout
    loaded = pickle.loads(blob)
    here = Shape("h100", 8, 1, 8, 4, 2, "rack", 250, 1024, True)
    assert loaded == here
    assert hash(loaded) == hash(here)
    assert {here: "fits"}.get(loaded) == "fits"
    assert loaded.failure_key(True) == here.failure_key(True)
    assert loaded.min_gpus == here.min_gpus
