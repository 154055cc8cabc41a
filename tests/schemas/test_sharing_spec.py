"""The job spec's ways to share a GPU (DESIGN §8): exactly one of whole GPUs, a MIG slice or a
GPU share; CPUs and memory for every job; a CPU-only task names its CPUs."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from schemas.jobs import JobSpec

BASE: dict[str, Any] = {"name": "serve", "team": "nlp"}


def spec(**fields: Any) -> JobSpec:
    return JobSpec.model_validate({**BASE, **fields})


def test_a_slice_job_asks_one_profile_per_task_on_one_gpu() -> None:
    job = spec(mig_profile="1g.10gb", tasks=7)
    assert job.mig_profile == "1g.10gb"
    assert job.gpus_per_task == 1
    assert job.fractional


def test_a_share_is_enforced_by_mps_unless_told_otherwise() -> None:
    job = spec(gpu_fraction=0.25, gpu_memory_mb=20_000)
    assert job.sharing == "mps"
    assert job.gpu_thousandths == 250
    assert spec(gpu_fraction=0.5, sharing="timeslice").sharing == "timeslice"


def test_gpus_per_task_zero_beside_a_slice_or_share_is_allowed() -> None:
    assert spec(mig_profile="3g.40gb", gpus_per_task=0).gpus_per_task == 1
    assert spec(gpu_fraction=0.125, gpus_per_task=0).gpus_per_task == 1


@pytest.mark.parametrize(
    "fields",
    [
        {"mig_profile": "1g.10gb", "gpus_per_task": 1},
        {"gpu_fraction": 0.5, "gpus_per_task": 2},
        {"mig_profile": "1g.10gb", "gpu_fraction": 0.5},
    ],
)
def test_a_job_asks_exactly_one_of_whole_gpus_a_slice_or_a_share(fields: dict[str, Any]) -> None:
    with pytest.raises(ValidationError, match="exactly one of"):
        spec(**fields)


@pytest.mark.parametrize("fraction", [0, 1, 1.5, -0.25, 0.0005, 0.3333])
def test_a_fraction_lies_strictly_between_0_and_1_in_thousandths(fraction: float) -> None:
    with pytest.raises(ValidationError):
        spec(gpu_fraction=fraction)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"sharing": "mps"}, "gpu_fraction job only"),
        ({"gpu_memory_mb": 1024}, "gpu_fraction job only"),
        ({"mig_profile": "1g.10gb", "gpu_memory_mb": 1024}, "gpu_fraction job only"),
        ({"gpu_fraction": 0.5, "sharing": "vgpu"}, "sharing"),
        ({"mig_profile": "ten-gigs"}, "mig_profile"),
        ({"mig_profile": "2g.20gb", "topology": {"tp_size": 2}}, "whole GPUs only"),
    ],
)
def test_sharing_fields_only_make_sense_together(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        spec(**fields)


def test_a_cpu_only_task_must_give_its_cpus() -> None:
    with pytest.raises(ValidationError, match="cpus_per_task"):
        spec(gpus_per_task=0)
    job = spec(gpus_per_task=0, cpus_per_task=4, memory_mb_per_task=8192)
    assert (job.total_gpus, job.cpus_per_task, job.memory_mb_per_task) == (0, 4, 8192)


def test_every_job_may_ask_cpus_and_memory() -> None:
    job = spec(gpus_per_task=8, cpus_per_task=32, memory_mb_per_task=262_144)
    assert (job.cpus_per_task, job.memory_mb_per_task) == (32, 262_144)
    with pytest.raises(ValidationError):
        spec(cpus_per_task=0)
    with pytest.raises(ValidationError):
        spec(memory_mb_per_task=0)


def test_a_whole_gpu_job_is_as_it_was() -> None:
    job = spec(tasks=4, gpus_per_task=8)
    assert (job.mig_profile, job.gpu_fraction, job.sharing, job.fractional) == (
        None,
        None,
        None,
        False,
    )
    assert job.total_gpus == 32


def test_a_slice_or_share_spec_reads_back_as_it_was_recorded() -> None:
    for job in (spec(mig_profile="1g.10gb", tasks=7), spec(gpu_fraction=0.25)):
        stored = job.model_dump(mode="json")
        assert "gpus_per_task" not in stored
        assert JobSpec.model_validate(stored) == job
        assert JobSpec.model_validate_json(job.model_dump_json()) == job
    whole = spec(gpus_per_task=4)
    assert JobSpec.model_validate(whole.model_dump(mode="json")) == whole
