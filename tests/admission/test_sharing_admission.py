"""Admission of slice, share and CPU-only jobs while the scheduler places whole GPUs only."""

from __future__ import annotations

from core.admission import AdmissionCatalog, admit
from schemas.jobs import JobAdmitted, JobRejected, JobSpec
from tests.admission.test_admission_rules import CLASSES, catalog, job

__all__ = ["catalog"]


def test_slice_and_share_jobs_are_admitted(catalog: AdmissionCatalog) -> None:
    for spec in (job(mig_profile="1g.10gb", tasks=7), job(gpu_fraction=0.25)):
        assert isinstance(admit("j1", spec, catalog, CLASSES), JobAdmitted)


def test_a_cpu_only_job_is_refused_with_a_reason_not_a_crash(catalog: AdmissionCatalog) -> None:
    spec = JobSpec(name="prep", team="nlp", gpus_per_task=0, cpus_per_task=4)
    result = admit("j1", spec, catalog, CLASSES)
    assert isinstance(result, JobRejected) and result.code == "cpu_only_unsupported"
