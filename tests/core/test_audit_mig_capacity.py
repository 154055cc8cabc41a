"""The auditor's idle-capacity rule counts only GPUs a whole-GPU gang could be given: a GPU in
MIG mode (a node of fixed geometry, or a dynamic node's GPU partitioned or being re-partitioned)
or one holding shares is not idle whole capacity, so a reclaim on a cluster that has MIG nodes is
no idle-capacity preemption.

Found by the hostile-tenant run on a stack with an A100 node of fixed MIG geometry: a team within
its guarantee rightly reclaimed 4 GPUs from a borrower, and `gangway audit` reported "preempted
... while idle GPUs could host" because it counted the A100's eight sliced GPUs as free."""

from __future__ import annotations

from core import Auditor, parse_cluster_spec
from schemas.base import Event
from schemas.jobs import (
    GangReserved,
    JobAdmitted,
    JobSpec,
    JobSubmitted,
    PreemptionRequested,
    RankPlacement,
    TaskStarted,
)
from schemas.nodes import GpuGeometryChanged, MigInstanceSpec
from schemas.teams import TeamCreated

T = 1_700_000_000.0
EVERY_H100 = RankPlacement(rank=0, node_id="n0000", gpus=list(range(8)))


def cluster(a100_mig: str) -> list[Event]:
    """n0000: 8 H100s; n0001: 8 A100-40GBs with `mig: a100_mig`."""
    return [
        *parse_cluster_spec(
            "groups:\n"
            "  - {count: 1, gpus: 8, gpu_type: H100}\n"
            f"  - {{count: 1, gpus: 8, gpu_type: A100, gpu_model: A100-40GB, mig: {a100_mig}}}\n"
        )
    ]


def job(job_id: str, team: str, gpus: int) -> list[Event]:
    spec = JobSpec.model_validate({"name": job_id, "team": team, "gpus_per_task": gpus})
    return [
        JobSubmitted(job_id=job_id, spec=spec, submitted_by="u"),
        JobAdmitted(job_id=job_id, queue=team, priority="research"),
    ]


def world(a100_mig: str, *between: Event) -> list[Event]:
    """Borrower's gang holds every H100; owner (guaranteed 8, holding nothing) asks 4 GPUs of
    any type and its scheduler reclaims them from the borrower."""
    return [
        *cluster(a100_mig),
        *between,
        TeamCreated(name="owner", guaranteed_gpus=8, token_sha256="0" * 64),
        TeamCreated(name="borrower", guaranteed_gpus=0, token_sha256="1" * 64),
        *job("b1", "borrower", 8),
        GangReserved(
            job_id="b1",
            attempt=1,
            ranks=[RankPlacement(rank=0, node_id="n0000", gpus=list(range(8)))],
        ),
        TaskStarted(job_id="b1", attempt=1, rank=0, node_id="n0000"),
        *job("o1", "owner", 4),
        PreemptionRequested(
            job_id="b1", attempt=1, preemptor_job_id="o1", reason="reclaim", grace_s=120
        ),
    ]


def rules(events: list[Event], at: float = T) -> list[str | None]:
    auditor = Auditor()
    for position, event in enumerate(events):
        auditor.observe(event, position, at, None)
    return [violation.rule for violation in auditor.violations]


def test_gpus_of_a_fixed_mig_node_are_not_idle_capacity_for_a_whole_gpu_gang() -> None:
    assert rules(world("[3g.20gb, 2g.10gb, 1g.5gb, 1g.5gb]")) == []


def test_idle_whole_gpus_of_the_same_node_are_idle_capacity() -> None:
    """The rule still holds where the A100s are whole: the reclaim was not needed."""
    assert rules(world("none")) == ["idle_capacity"]


def test_a_dynamic_node_gpu_partitioned_is_not_idle_capacity_until_it_is_whole_again() -> None:
    partitioned = [
        GpuGeometryChanged(
            node_id="n0001",
            gpu_index=index,
            geometry=[MigInstanceSpec(profile="7g.40gb", start=0)],
            reconfigure_s=60,
            reason="slices wait",
        )
        for index in range(8)
    ]

    assert rules(world("dynamic", *partitioned)) == []
    assert rules(world("dynamic")) == ["idle_capacity"]
