"""The auditor reads invariant 1 for slices and shares: a recorded log that double-books a
slice, oversubscribes or mixes teams on a soft-shared GPU, or re-partitions a busy GPU, is
reported; a log that keeps the rules is not."""

from __future__ import annotations

from core.audit import Auditor
from core.topology import parse_cluster_spec
from schemas.base import Event
from schemas.jobs import GangReserved, JobSpec, JobSubmitted, MigSlice, RankPlacement
from schemas.nodes import GpuGeometryChanged, MigInstanceSpec
from tests.core.builders import share_on

CLUSTER = (
    "groups:\n"
    "  - {count: 1, gpus: 2, gpu_type: H100, mig: dynamic, cpus: 16}\n"
    "  - {count: 1, gpus: 1, gpu_type: H100}\n"
)


def audit(*events: Event) -> list[str]:
    auditor = Auditor()
    log = [*parse_cluster_spec(CLUSTER), *events]
    for position, event in enumerate(log, start=1):
        auditor.observe(event, position, float(position), None)
    return [v.message for v in auditor.violations if v.invariant == 1]


def submitted(job: str, team: str, **fields: object) -> JobSubmitted:
    return JobSubmitted(
        job_id=job,
        spec=JobSpec.model_validate({"name": job, "team": team, **fields}),
        submitted_by=team,
    )


def slice_at(job: str, node: str, gpu: int, profile: str, start: int) -> GangReserved:
    return GangReserved(
        job_id=job,
        attempt=1,
        ranks=[
            RankPlacement(
                rank=0, node_id=node, gpus=[gpu], mig=MigSlice(profile=profile, start=start)
            )
        ],
    )


def geometry(gpu: int, *instances: tuple[str, int]) -> GpuGeometryChanged:
    return GpuGeometryChanged(
        node_id="n0000",
        gpu_index=gpu,
        geometry=[MigInstanceSpec(profile=p, start=s) for p, s in instances],
        reconfigure_s=0,
        reason="test",
    )


def test_slices_of_two_teams_in_a_valid_geometry_are_fine() -> None:
    assert (
        audit(
            geometry(0, ("3g.40gb", 0), ("3g.40gb", 4)),
            submitted("a", "nlp", mig_profile="3g.40gb"),
            submitted("b", "vision", mig_profile="3g.40gb"),
            slice_at("a", "n0000", 0, "3g.40gb", 0),
            slice_at("b", "n0000", 0, "3g.40gb", 4),
        )
        == []
    )


def test_a_slice_booked_twice_is_reported() -> None:
    found = audit(
        geometry(0, ("7g.80gb", 0)),
        submitted("a", "nlp", mig_profile="7g.80gb"),
        submitted("b", "nlp", mig_profile="7g.80gb"),
        slice_at("a", "n0000", 0, "7g.80gb", 0),
        slice_at("b", "n0000", 0, "7g.80gb", 0),
    )
    assert any("already held" in message for message in found), found


def test_a_slice_outside_the_geometry_or_an_invalid_geometry_is_reported() -> None:
    found = audit(
        geometry(0, ("4g.40gb", 0), ("4g.40gb", 0)),
        submitted("a", "nlp", mig_profile="2g.20gb"),
        slice_at("a", "n0000", 1, "2g.20gb", 0),
    )
    assert any("overlaps" in message for message in found), found
    assert any("no 2g.20gb at slot 0" in message for message in found), found


def test_a_busy_gpu_re_partitioned_is_reported() -> None:
    found = audit(
        geometry(0, ("1g.10gb", 0)),
        submitted("a", "nlp", mig_profile="1g.10gb"),
        slice_at("a", "n0000", 0, "1g.10gb", 0),
        geometry(0, ("7g.80gb", 0)),
    )
    assert any("while it held work" in message for message in found), found


def test_two_teams_on_a_soft_shared_gpu_and_an_oversubscribed_one_are_reported() -> None:
    found = audit(
        submitted("a", "nlp", gpu_fraction=0.5),
        submitted("b", "vision", gpu_fraction=0.5),
        submitted("c", "nlp", gpu_fraction=0.75),
        share_on("a", "n0001", 0, 500),
        share_on("b", "n0001", 0, 500),
        share_on("c", "n0001", 0, 750),
    )
    assert any("soft-shared by teams nlp, vision" in message for message in found), found
    assert any("shares sum to 1750/1000" in message for message in found), found


def test_cpus_beyond_the_node_are_reported() -> None:
    found = audit(
        submitted("a", "nlp", gpus_per_task=1, cpus_per_task=12),
        submitted("b", "nlp", gpus_per_task=1, cpus_per_task=12),
        GangReserved(
            job_id="a", attempt=1, ranks=[RankPlacement(rank=0, node_id="n0000", gpus=[0])]
        ),
        GangReserved(
            job_id="b", attempt=1, ranks=[RankPlacement(rank=0, node_id="n0000", gpus=[1])]
        ),
    )
    assert any("24.0 CPUs in use of 16" in message for message in found), found
