"""Admission of slice, share and CPU-only jobs, and of CPU and memory asks (DESIGN §8)."""

from __future__ import annotations

from core.admission import AdmissionCatalog, admit
from schemas.jobs import JobAdmitted, JobRejected, JobSpec
from schemas.nodes import NodeRegistered
from schemas.teams import TeamCreated
from tests.admission.test_admission_rules import CLASSES, catalog, job, node, rejection

__all__ = ["catalog"]


def with_host(event: NodeRegistered, cpus: int, memory_mb: int) -> NodeRegistered:
    return event.model_copy(update={"cpus": cpus, "memory_mb": memory_mb})


def declared(catalog: AdmissionCatalog) -> AdmissionCatalog:
    """The fixture's fleet, every node declaring 64 CPUs and 512 GB (a0: 16 CPUs, 64 GB)."""
    for name, rack in (("n0", "r0"), ("n1", "r0"), ("n2", "r1"), ("n3", "r1")):
        catalog.apply(with_host(node(name, rack=rack), 64, 524_288))
    catalog.apply(with_host(node("a0", gpus=4, rack="r2", gpu_type="A100"), 16, 65_536))
    return catalog


def mig_node(node_id: str, mig: str = "dynamic", profiles: tuple[str, ...] = (),
             gpus: int = 8, memory_mb: int = 81_559) -> NodeRegistered:  # fmt: skip
    """An H100 80GB node in MIG mode (`dynamic`, or `fixed` with `profiles` on every GPU)."""
    event = node(node_id, gpus=gpus)
    return event.model_copy(
        update={
            "gpu_model": "H100-80GB",
            "mig": mig,
            "mig_profiles": list(profiles),
            "gpus": [g.model_copy(update={"memory_mb": memory_mb}) for g in event.gpus],
        }
    )


def test_slice_and_share_jobs_are_admitted(catalog: AdmissionCatalog) -> None:
    catalog.apply(mig_node("m0"))
    for spec in (job(mig_profile="1g.10gb", tasks=7), job(gpu_fraction=0.25)):
        assert isinstance(admit("j1", spec, catalog, CLASSES), JobAdmitted)


def test_a_slice_job_on_a_fleet_without_mig_is_refused(catalog: AdmissionCatalog) -> None:
    """The fixture's fleet has no GPU in MIG mode: the job could never run, so it is refused
    (it used to be admitted and wait for ever as `unsatisfiable`)."""
    result = admit("j1", job(mig_profile="1g.10gb"), catalog, CLASSES)
    assert rejection(result) == "mig_profile_unavailable"
    assert isinstance(result, JobRejected) and "1g.10gb" in result.reason


def test_a_profile_only_a_fixed_geometry_lacks_is_refused(catalog: AdmissionCatalog) -> None:
    """A fixed geometry of seven 1g.10gb offers no 3g.40gb; once a dynamic node joins it may."""
    catalog.apply(mig_node("f0", mig="fixed", profiles=("1g.10gb",) * 7))
    assert isinstance(admit("j1", job(mig_profile="1g.10gb"), catalog, CLASSES), JobAdmitted)
    assert rejection(admit("j2", job(mig_profile="3g.40gb"), catalog, CLASSES)) == (
        "mig_profile_unavailable"
    )
    catalog.apply(mig_node("m0"))
    assert isinstance(admit("j3", job(mig_profile="3g.40gb"), catalog, CLASSES), JobAdmitted)


def test_a_slice_gang_counts_slices_not_gpus(catalog: AdmissionCatalog) -> None:
    """One 1-GPU MIG node holds 7 1g.10gb slices or 2 3g.40gb: a gang of 7 fits, of 8 never."""
    catalog.apply(mig_node("m0", gpus=1))
    assert isinstance(admit("j1", job(mig_profile="1g.10gb", tasks=7), catalog, CLASSES),
                      JobAdmitted)  # fmt: skip
    assert rejection(admit("j2", job(mig_profile="1g.10gb", tasks=8), catalog, CLASSES)) == (
        "gang_too_large"
    )
    assert rejection(admit("j3", job(mig_profile="3g.40gb", tasks=3), catalog, CLASSES)) == (
        "gang_too_large"
    )


def test_a_slice_gang_counts_exact_fractions_against_the_ceiling(
    catalog: AdmissionCatalog,
) -> None:
    """Team nlp may never use more than 32 GPUs: 224 1g slices are exactly 32 GPUs (7 to a
    GPU), 225 are more."""
    for index in range(5):
        catalog.apply(mig_node(f"m{index}"))
    fits = job(mig_profile="1g.10gb", tasks=224)
    assert isinstance(admit("j1", fits, catalog, CLASSES), JobAdmitted)
    over = job(mig_profile="1g.10gb", tasks=225)
    assert rejection(admit("j2", over, catalog, CLASSES)) == "over_quota_max"


def test_a_share_asking_more_gpu_memory_than_any_gpu_has_is_refused(
    catalog: AdmissionCatalog,
) -> None:
    catalog.apply(mig_node("m0", mig="none", memory_mb=81_559))
    fits = job(gpu_fraction=0.5, gpu_memory_mb=81_559)
    assert isinstance(admit("j1", fits, catalog, CLASSES), JobAdmitted)
    result = admit("j2", job(gpu_fraction=0.5, gpu_memory_mb=81_560), catalog, CLASSES)
    assert rejection(result) == "gpu_memory_too_large"
    assert isinstance(result, JobRejected) and "81559 MB" in result.reason


def test_a_share_on_a_fleet_of_fixed_geometries_only_is_refused() -> None:
    catalog = AdmissionCatalog()
    catalog.apply(TeamCreated(name="nlp", guaranteed_gpus=8, token_sha256="a" * 64))
    catalog.apply(mig_node("f0", mig="fixed", profiles=("7g.80gb",)))
    assert rejection(admit("j1", job(gpu_fraction=0.25), catalog, CLASSES)) == (
        "gpu_share_unavailable"
    )


def test_a_cpu_only_job_is_admitted_into_its_teams_queue(catalog: AdmissionCatalog) -> None:
    spec = JobSpec(name="prep", team="nlp", gpus_per_task=0, cpus_per_task=4)
    result = admit("j1", spec, catalog, CLASSES)
    assert isinstance(result, JobAdmitted) and result.queue == "nlp"


def test_a_cpu_only_job_on_a_fleet_that_declares_no_cpus_counts_8_cpus_per_gpu(
    catalog: AdmissionCatalog,
) -> None:
    """Undeclared CPUs do not limit GPU gangs, but nothing else bounds a CPU-only gang: such
    a node holds CPU-only tasks of 8 CPUs per GPU (core/host.py), never a 4,096-rank pile."""
    assert isinstance(
        admit("j1", job(gpus_per_task=0, cpus_per_task=8), catalog, CLASSES), JobAdmitted
    )
    result = admit("j2", job(gpus_per_task=0, cpus_per_task=256, tasks=1000), catalog, CLASSES)
    assert rejection(result) == "task_too_large"
    assert isinstance(result, JobRejected)
    assert "declares no CPUs" in result.reason


def test_a_task_asking_more_cpus_than_any_node_has_is_refused(catalog: AdmissionCatalog) -> None:
    declared(catalog)
    result = admit("j1", job(gpus_per_task=8, cpus_per_task=96), catalog, CLASSES)
    assert rejection(result) == "task_too_large"
    assert isinstance(result, JobRejected)
    assert result.reason == "a task needs 96 CPUs but the largest node has 64"


def test_a_task_asking_more_memory_than_any_node_has_is_refused(
    catalog: AdmissionCatalog,
) -> None:
    declared(catalog)
    small = job(gpus_per_task=0, cpus_per_task=1, memory_mb_per_task=1)
    assert isinstance(admit("j1", small, catalog, CLASSES), JobAdmitted)
    result = admit(
        "j2", job(gpus_per_task=0, cpus_per_task=1, memory_mb_per_task=600_000), catalog, CLASSES
    )
    assert rejection(result) == "task_too_large"


def test_the_cpus_of_a_node_too_small_for_the_gpus_do_not_count(catalog: AdmissionCatalog) -> None:
    """An 8-GPU task can only run on the 8-GPU nodes (64 CPUs), not beside the A100's 4 GPUs."""
    declared(catalog)
    assert rejection(admit("j1", job(gpus_per_task=8, cpus_per_task=65), catalog, CLASSES)) == (
        "task_too_large"
    )
    assert isinstance(admit("j2", job(gpus_per_task=8, cpus_per_task=64), catalog, CLASSES),
                      JobAdmitted)  # fmt: skip


def test_a_cpu_only_gang_larger_than_the_fleet_is_refused(catalog: AdmissionCatalog) -> None:
    """4 nodes x 64 CPUs + 16 on a0 = 272 CPUs: 17 tasks of 16 fit, 18 never will; in one
    node, 4 tasks of 16."""
    declared(catalog)
    assert isinstance(
        admit("j1", job(gpus_per_task=0, cpus_per_task=16, tasks=17), catalog, CLASSES),
        JobAdmitted,
    )
    assert (
        rejection(admit("j2", job(gpus_per_task=0, cpus_per_task=16, tasks=18), catalog, CLASSES))
        == "gang_too_large"
    )
    one_node = job(gpus_per_task=0, cpus_per_task=16, tasks=5, topology={"require": "node"})
    assert rejection(admit("j3", one_node, catalog, CLASSES)) == "gang_too_large"


def test_whole_gpus_of_a_type_whose_every_node_has_a_fixed_geometry_are_refused(
    catalog: AdmissionCatalog,
) -> None:
    """A fixed geometry never gives a whole GPU back: such a job was admitted and waited for
    ever (found by the adversarial run). A dynamic node of the type can be cut back: admitted."""
    fixed = mig_node("f0", mig="fixed", profiles=("1g.10gb",) * 7)
    catalog.apply(fixed.model_copy(update={"gpu_type": "H100MIG"}))
    result = admit("j1", job(gpu_type="H100MIG", gpus_per_task=1), catalog, CLASSES)
    assert rejection(result) == "task_too_large"
    assert isinstance(result, JobRejected) and "fixed MIG geometry" in result.reason
    catalog.apply(mig_node("d0").model_copy(update={"gpu_type": "H100MIG"}))
    admitted = admit("j2", job(gpu_type="H100MIG", gpus_per_task=1), catalog, CLASSES)
    assert isinstance(admitted, JobAdmitted)


def test_a_fixed_geometry_node_does_not_count_toward_a_whole_gpu_gang(
    catalog: AdmissionCatalog,
) -> None:
    """Four 8-GPU H100 nodes hold 32 whole GPUs; a fifth with a fixed geometry adds none."""
    catalog.apply(mig_node("f0", mig="fixed", profiles=("1g.10gb",) * 7))
    gang = job(team="vision", tasks=5, gpus_per_task=8)
    assert rejection(admit("j1", gang, catalog, CLASSES)) == "gang_too_large"
    catalog.apply(mig_node("d0"))
    assert isinstance(admit("j2", gang, catalog, CLASSES), JobAdmitted)
