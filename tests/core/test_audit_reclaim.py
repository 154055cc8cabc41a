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
from tests.core.builders import History, a_job

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


def test_borrowed_gpus_where_the_waiting_gang_cannot_land_do_not_count() -> None:
    """The random property tests' invariant-4 report (docs/testing.md), made small: gamma's
    job needs a whole node within its guarantee; alpha borrows 14 preemptible GPUs, but a
    non-preemptible gang of alpha's sits on each node, so no eviction frees a node. The core
    rightly waits; the auditor counts only borrowed gangs whose eviction would let the gang
    land. Once a node can be freed, gamma reclaims it at once."""
    history = History("2x8:2:1")
    history.team("alpha").team("gamma", guaranteed=8)
    pinned = [
        history.occupy(node, 1, a_job().team("alpha").priority("inference-critical"))
        for node in ("n0000", "n0001")
    ]
    borrowed = [history.occupy(node, 7, a_job().team("alpha")) for node in ("n0000", "n0001")]
    owner = history.submit(a_job().gpus(8).team("gamma"))[0]

    history.run(cycles=8, every_s=600)  # 4800 s: past the auditor's bound of 3600 s

    assert history.events(PreemptionRequested) == []
    assert history.job(owner).state == "queued"
    assert history.auditor.violations == []

    history.exit(pinned[0])
    history.run()

    assert [p.job_id for p in history.events(PreemptionRequested)] == [borrowed[0]]
    assert history.auditor.violations == []


def test_a_best_effort_job_within_its_guarantee_is_promised_idle_capacity_only() -> None:
    """Best-effort work runs on idle capacity (DESIGN §3): the core never reclaims for it,
    and its wait beside borrowers breaks no promise; a research job's does."""

    def waited(priority: str) -> list[Violation]:
        events: list[Event] = [
            *parse_cluster_spec("2x8:2:1"),
            team("alpha"),
            team("gamma", 8),
            *running("a1", "alpha", "n0000"),
            *running("a2", "alpha", "n0001"),
            JobSubmitted(
                job_id="owner",
                spec=JobSpec(name="o", team="gamma", gpus_per_task=8, priority=priority),
                submitted_by="u",
            ),
            JobAdmitted(job_id="owner", queue="gamma", priority=priority),
        ]
        auditor = Auditor(reclaim_within_s=600)
        for position, event in enumerate(events):
            auditor.observe(event, position, T, None)
        for offset, wait in enumerate((0, 601)):
            deferral = JobDeferred(job_id="owner", code="no_capacity", message=f"m{offset}")
            auditor.observe(deferral, len(events) + offset, T + wait, None)
        return auditor.violations

    assert waited("best-effort") == []
    assert [v.invariant for v in waited("research")] == [4]
