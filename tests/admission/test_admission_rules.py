"""Admission rules: what a job must satisfy before it may wait for GPUs."""

from __future__ import annotations

from typing import Any

import pytest

from core.admission import AdmissionCatalog, admit
from schemas.jobs import JobAdmitted, JobRejected, JobSpec, TopologySpec
from schemas.nodes import GpuInfo, NodeRegistered
from schemas.teams import QueueConfigured, TeamCreated

CLASSES = ("inference-critical", "production", "research", "best-effort")
SHA = "a" * 64


def node(node_id: str, gpus: int = 8, rack: str = "r0", block: str = "b0", gpu_type: str = "H100"
         ) -> NodeRegistered:  # fmt: skip
    return NodeRegistered(
        node_id=node_id,
        hostname=node_id,
        gpu_type=gpu_type,
        gpus=[
            GpuInfo(index=i, uuid=f"{node_id}-{i}", model=gpu_type, memory_mb=1)
            for i in range(gpus)
        ],
        rack=rack,
        block=block,
        discovered_by="spec",
    )


@pytest.fixture
def catalog() -> AdmissionCatalog:
    """Two racks of two 8-GPU H100 nodes, one 4-GPU A100 node; teams nlp (max 32) and vision."""
    history = [
        QueueConfigured(name="research-org", guaranteed_gpus=32, max_gpus=40),
        TeamCreated(name="nlp", parent="research-org", guaranteed_gpus=16, max_gpus=32,
                    token_sha256=SHA),
        TeamCreated(name="vision", guaranteed_gpus=8, token_sha256=SHA),
        node("n0", rack="r0"), node("n1", rack="r0"), node("n2", rack="r1"), node("n3", rack="r1"),
        node("a0", gpus=4, rack="r2", gpu_type="A100"),
    ]  # fmt: skip
    catalog = AdmissionCatalog()
    for event in history:
        catalog.apply(event)
    return catalog


def job(**fields: Any) -> JobSpec:
    return JobSpec.model_validate({"name": "train", "team": "nlp", **fields})


def rejection(result: JobAdmitted | JobRejected) -> str:
    assert isinstance(result, JobRejected), f"expected a rejection, got {result}"
    return result.code


def test_a_fitting_job_is_admitted_into_its_teams_queue(catalog: AdmissionCatalog) -> None:
    result = admit("j1", job(tasks=2, gpus_per_task=8), catalog, CLASSES)
    assert result == JobAdmitted(job_id="j1", queue="nlp", priority="research")


def test_an_unknown_team_is_rejected(catalog: AdmissionCatalog) -> None:
    assert rejection(admit("j1", job(team="ghosts"), catalog, CLASSES)) == "unknown_team"


def test_an_unknown_queue_is_rejected(catalog: AdmissionCatalog) -> None:
    assert rejection(admit("j1", job(queue="nowhere"), catalog, CLASSES)) == "unknown_queue"


def test_another_teams_queue_is_rejected(catalog: AdmissionCatalog) -> None:
    assert rejection(admit("j1", job(queue="vision"), catalog, CLASSES)) == "foreign_queue"


def test_the_parent_org_queue_is_not_the_teams_to_use(catalog: AdmissionCatalog) -> None:
    assert rejection(admit("j1", job(queue="research-org"), catalog, CLASSES)) == "foreign_queue"


def test_a_sub_queue_of_the_team_is_accepted(catalog: AdmissionCatalog) -> None:
    catalog.apply(QueueConfigured(name="nlp-eval", parent="nlp", guaranteed_gpus=0, max_gpus=8))
    result = admit("j1", job(queue="nlp-eval"), catalog, CLASSES)
    assert result == JobAdmitted(job_id="j1", queue="nlp-eval", priority="research")


def test_a_team_nested_under_another_keeps_its_queue_and_its_subtree(
    catalog: AdmissionCatalog,
) -> None:
    # The admin placed team speech's queue (and a sub-queue of it) under team nlp's.
    catalog.apply(TeamCreated(name="speech", parent="nlp", guaranteed_gpus=8, token_sha256=SHA))
    catalog.apply(QueueConfigured(name="speech-eval", parent="speech", guaranteed_gpus=0))
    for queue in ("speech", "speech-eval"):
        assert rejection(admit("j1", job(queue=queue), catalog, CLASSES)) == "foreign_queue"
        result = admit("j2", job(team="speech", queue=queue), catalog, CLASSES)
        assert result == JobAdmitted(job_id="j2", queue=queue, priority="research")
    # nlp's own sub-queues stay nlp's.
    catalog.apply(QueueConfigured(name="nlp-eval", parent="nlp", guaranteed_gpus=0))
    assert isinstance(admit("j3", job(queue="nlp-eval"), catalog, CLASSES), JobAdmitted)


def test_an_unknown_priority_class_is_rejected(catalog: AdmissionCatalog) -> None:
    result = admit("j1", job(priority="urgent"), catalog, CLASSES)
    assert rejection(result) == "unknown_priority"
    assert isinstance(result, JobRejected) and "best-effort" in result.reason


def test_a_best_effort_job_cannot_refuse_preemption(catalog: AdmissionCatalog) -> None:
    result = admit("j1", job(priority="best-effort", preemptible=False), catalog, CLASSES)
    assert rejection(result) == "not_preemptible"


def test_an_unknown_gpu_type_is_rejected_naming_the_known_ones(catalog: AdmissionCatalog) -> None:
    result = admit("j1", job(gpu_type="B200"), catalog, CLASSES)
    assert rejection(result) == "unknown_gpu_type"
    assert isinstance(result, JobRejected) and "A100, H100" in result.reason


def test_a_task_larger_than_any_node_is_rejected(catalog: AdmissionCatalog) -> None:
    assert rejection(admit("j1", job(gpus_per_task=16), catalog, CLASSES)) == "task_too_large"


def test_a_tp_group_larger_than_any_nvlink_domain_is_rejected(catalog: AdmissionCatalog) -> None:
    spec = job(tasks=16, gpus_per_task=1, topology=TopologySpec(tp_size=16))
    assert rejection(admit("j1", spec, catalog, CLASSES)) == "task_too_large"


def test_a_gang_above_the_teams_ceiling_is_rejected(catalog: AdmissionCatalog) -> None:
    result = admit("j1", job(tasks=5, gpus_per_task=8), catalog, CLASSES)
    assert rejection(result) == "over_quota_max"
    assert isinstance(result, JobRejected) and "'nlp'" in result.reason


def test_a_parent_queues_ceiling_binds_its_teams(catalog: AdmissionCatalog) -> None:
    catalog.apply(TeamCreated(name="big", parent="research-org", guaranteed_gpus=0,
                              max_gpus=None, token_sha256=SHA))  # fmt: skip
    result = admit("j1", job(team="big", tasks=41), catalog, CLASSES)
    assert isinstance(result, JobRejected) and "'research-org'" in result.reason


def test_a_gang_larger_than_the_cluster_is_rejected(catalog: AdmissionCatalog) -> None:
    spec = job(team="vision", tasks=5, gpus_per_task=8, gpu_type="H100")
    assert rejection(admit("j1", spec, catalog, CLASSES)) == "gang_too_large"


def test_a_rack_local_gang_must_fit_in_one_rack(catalog: AdmissionCatalog) -> None:
    spec = job(tasks=3, gpus_per_task=8, topology=TopologySpec(require="rack"))
    assert rejection(admit("j1", spec, catalog, CLASSES)) == "gang_too_large"


def test_a_node_local_gang_fits_when_one_node_holds_it(catalog: AdmissionCatalog) -> None:
    spec = job(tasks=4, gpus_per_task=2, topology=TopologySpec(require="node"))
    assert isinstance(admit("j1", spec, catalog, CLASSES), JobAdmitted)


def test_an_elastic_gang_needs_only_its_minimum_to_fit(catalog: AdmissionCatalog) -> None:
    spec = job(team="vision", tasks=8, min_tasks=4, gpus_per_task=8, gpu_type="H100")
    assert isinstance(admit("j1", spec, catalog, CLASSES), JobAdmitted)


def test_single_gpu_ranks_of_a_tp_group_share_a_node(catalog: AdmissionCatalog) -> None:
    # Three 4-GPU groups cannot be spread as single ranks over the A100 node's 4 GPUs.
    spec = job(tasks=8, gpus_per_task=1, gpu_type="A100", topology=TopologySpec(tp_size=4))
    assert rejection(admit("j1", spec, catalog, CLASSES)) == "gang_too_large"


def pcie_box(node_id: str, gpus: int = 8, gpu_type: str = "L40S") -> NodeRegistered:
    return node(node_id, gpus=gpus, rack="r9", gpu_type=gpu_type).model_copy(
        update={"nvlink": False}
    )


def test_a_tp_job_of_a_type_whose_every_node_lacks_nvlink_is_rejected(
    catalog: AdmissionCatalog,
) -> None:
    catalog.apply(pcie_box("l0"))
    tp = job(gpus_per_task=4, gpu_type="L40S", topology=TopologySpec(tp_size=4))
    plain = job(gpus_per_task=4, gpu_type="L40S")

    result = admit("j1", tp, catalog, CLASSES)

    assert rejection(result) == "task_too_large"
    assert isinstance(result, JobRejected) and result.reason == (
        "a tensor-parallel group needs 4 GPUs joined by NVLink but no node of type 'L40S' "
        "joins its GPUs by NVLink (they talk over PCIe)"
    )
    assert isinstance(admit("j2", plain, catalog, CLASSES), JobAdmitted)


def test_pcie_boxes_do_not_count_toward_what_a_tp_gang_could_ever_hold(
    catalog: AdmissionCatalog,
) -> None:
    # The 32 H100s of the fixture hold 4 tp8 groups; 4 more H100s on PCIe hold none of them,
    # yet a gang of plain 8-GPU tasks may go to the one kind or the other.
    for number in range(4):
        catalog.apply(pcie_box(f"p{number}", gpu_type="H100"))
    tp = job(team="vision", tasks=5, gpus_per_task=8, topology=TopologySpec(tp_size=8))
    plain = job(team="vision", tasks=4, gpus_per_task=8)

    assert rejection(admit("j1", tp, catalog, CLASSES)) == "gang_too_large"
    assert isinstance(admit("j2", plain, catalog, CLASSES), JobAdmitted)


def test_a_plain_gang_of_a_type_counts_its_nodes_with_and_without_nvlink_apart(
    catalog: AdmissionCatalog,
) -> None:
    # Placement never mixes the two kinds in one gang (core/shape.py `pool_of`): 32 H100s
    # joined by NVLink and 32 on PCIe never hold 5 tasks of 8 GPUs; admitting it left it
    # waiting for good ("the cluster has only 32 schedulable GPUs of that kind").
    for number in range(4):
        catalog.apply(pcie_box(f"p{number}", gpu_type="H100"))
    plain = job(team="vision", tasks=5, gpus_per_task=8, gpu_type="H100")

    result = admit("j1", plain, catalog, CLASSES)

    assert isinstance(result, JobRejected) and result.reason == (
        "needs 5 tasks of 8 GPUs but the cluster can hold at most 4 on nodes of one kind "
        "(a gang never mixes nodes with and without NVLink)"
    )


def test_a_tp_group_larger_than_every_nvlink_node_says_so_beside_a_larger_pcie_box(
    catalog: AdmissionCatalog,
) -> None:
    catalog.apply(pcie_box("p0", gpus=16, gpu_type="H100"))
    spec = job(team="vision", gpus_per_task=16, topology=TopologySpec(tp_size=16))

    result = admit("j1", spec, catalog, CLASSES)

    assert isinstance(result, JobRejected) and result.reason == (
        "a task needs 16 GPUs in one NVLink domain but the largest node joined by NVLink has 8"
    )


def test_a_tp_task_asking_more_cpus_than_any_nvlink_node_has_is_rejected(
    catalog: AdmissionCatalog,
) -> None:
    # The PCIe box has the CPUs, but a tp group never goes there.
    catalog.apply(node("l0", gpu_type="L40S").model_copy(update={"cpus": 32}))
    catalog.apply(pcie_box("l1").model_copy(update={"cpus": 128}))
    tp = job(gpus_per_task=8, gpu_type="L40S", cpus_per_task=64, topology=TopologySpec(tp_size=8))
    plain = job(gpus_per_task=8, gpu_type="L40S", cpus_per_task=64)

    assert rejection(admit("j1", tp, catalog, CLASSES)) == "task_too_large"
    assert isinstance(admit("j2", plain, catalog, CLASSES), JobAdmitted)


def test_an_empty_cluster_admits_nothing(catalog: AdmissionCatalog) -> None:
    empty = AdmissionCatalog(teams=catalog.teams, queues=catalog.queues)
    assert rejection(admit("j1", job(), empty, CLASSES)) == "no_nodes"


def test_a_node_registered_after_a_verdict_counts_for_the_next_one(
    catalog: AdmissionCatalog,
) -> None:
    spec = job(team="vision", tasks=5, gpus_per_task=8, gpu_type="H100")
    assert rejection(admit("j1", spec, catalog, CLASSES)) == "gang_too_large"

    catalog.apply(node("n4", rack="r1"))

    assert isinstance(admit("j2", spec, catalog, CLASSES), JobAdmitted)


def test_a_larger_node_of_a_new_type_is_known_to_the_next_verdict(
    catalog: AdmissionCatalog,
) -> None:
    spec = job(team="vision", gpus_per_task=16, gpu_type="B200")
    assert rejection(admit("j1", spec, catalog, CLASSES)) == "unknown_gpu_type"

    catalog.apply(node("g0", gpus=16, rack="r3", gpu_type="B200"))

    assert isinstance(admit("j2", spec, catalog, CLASSES), JobAdmitted)
