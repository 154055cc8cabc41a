"""The auditor's reclaim checks (invariant 4) know quota trees: a job within its guarantee held
at a parent's ceiling that siblings' borrowing filled, and which borrowed GPUs could give it
room under that ceiling."""

from __future__ import annotations

from collections.abc import Sequence

from core import Auditor, Violation, parse_cluster_spec
from schemas.base import Event
from schemas.jobs import (
    GangReserved,
    JobAdmitted,
    JobDeferred,
    JobSpec,
    JobSubmitted,
    PreemptionRequested,
    RankPlacement,
    TaskStarted,
)
from schemas.teams import QueueConfigured, TeamCreated

T = 1_700_000_000.0
WHOLE = list(range(8))


def team(name: str, guaranteed: int = 0, parent: str | None = None) -> TeamCreated:
    return TeamCreated(name=name, parent=parent, guaranteed_gpus=guaranteed, token_sha256="0" * 64)


def job(job_id: str, team: str, **spec: object) -> list[Event]:
    fields: dict[str, object] = {"name": job_id, "team": team, "gpus_per_task": 8, **spec}
    return [
        JobSubmitted(job_id=job_id, spec=JobSpec.model_validate(fields), submitted_by="u"),
        JobAdmitted(job_id=job_id, queue=team, priority="research"),
    ]


def running(job_id: str, team: str, node: str, **spec: object) -> list[Event]:
    placement = RankPlacement(rank=0, node_id=node, gpus=WHOLE)
    return [
        *job(job_id, team, **spec),
        GangReserved(job_id=job_id, attempt=1, ranks=[placement]),
        TaskStarted(job_id=job_id, attempt=1, rank=0, node_id=node),
    ]


def world(org_max: int | None = 16, **spec: object) -> list[Event]:
    """4 nodes of 8 GPUs. The org (guaranteed 16, max `org_max`) holds alpha (guaranteed 8)
    and gamma (guaranteed 0); gamma's two gangs (of `spec`) hold 16 GPUs, beta's one (outside
    the org, guaranteed 0) 8; alpha's job of 8 GPUs waits."""
    return [
        *parse_cluster_spec("4x8:4:1"),
        QueueConfigured(name="org", guaranteed_gpus=16, max_gpus=org_max),
        team("alpha", 8, parent="org"),
        team("gamma", 0, parent="org"),
        team("beta", 0),
        *running("g1", "gamma", "n0000", **spec),
        *running("g2", "gamma", "n0001", **spec),
        *running("b1", "beta", "n0002"),
        *job("owner", "alpha"),
    ]


def held(events: Sequence[Event], *waits: float) -> list[Violation]:
    """Feed the history, then the owner's deferrals at the ceiling `waits` seconds later."""
    auditor = Auditor(reclaim_within_s=600)
    for position, event in enumerate(events):
        auditor.observe(event, position, T, None)
    for offset, wait in enumerate(waits):
        deferral = JobDeferred(job_id="owner", code="quota_ceiling", message="m")
        auditor.observe(deferral, len(events) + offset, T + wait, None)
    return auditor.violations


def test_held_at_a_parent_ceiling_past_the_bound_while_a_sibling_borrows_is_invariant_4() -> None:
    assert held(world(), 0, 600) == []

    violations = held(world(), 0, 601)

    assert [v.invariant for v in violations] == [4]
    assert violations[0].message == (
        "job owner waited 601 s within the guarantee of queue alpha at the ceiling of queue "
        "org while 16 borrowed GPUs could have been reclaimed"
    )


def test_only_preemptible_gpus_borrowed_under_the_full_ceiling_count() -> None:
    """Gamma's gangs are younger than their minimum runtime; beta's borrowed gang may be
    preempted, but evicting it frees GPUs outside the org, not room under its ceiling."""
    assert held(world(min_runtime_s=7200), 0, 601, 1300) == []
    assert held(world(preemptible=False), 0, 601, 1300) == []


def test_a_reclaim_that_makes_room_under_a_full_ceiling_is_no_idle_capacity_preemption() -> None:
    """Idle GPUs (node n0003) could host the owner, but the org's ceiling holds it back:
    evicting a gang of gamma's is the only way alpha reaches its guarantee. Without the
    ceiling the same eviction breaks the idle-capacity rule."""
    reclaim = PreemptionRequested(
        job_id="g1", attempt=1, preemptor_job_id="owner", reason="r", grace_s=120
    )

    def audit(events: list[Event]) -> list[str]:
        auditor = Auditor()
        for position, event in enumerate(events):
            auditor.observe(event, position, T, None)
        return [v.rule for v in auditor.violations]

    assert audit([*world(), reclaim]) == []
    assert audit([*world(org_max=None), reclaim]) == ["idle_capacity"]
