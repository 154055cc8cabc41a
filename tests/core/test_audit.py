"""The auditor catches each kind of invariant violation in hand-built histories."""

from __future__ import annotations

from collections.abc import Sequence

from core import Auditor, Violation, parse_cluster_spec
from schemas.base import Event
from schemas.jobs import (
    GangReserved,
    JobAdmitted,
    JobCancelled,
    JobDeferred,
    JobRequeued,
    JobSpec,
    JobSubmitted,
    JobSucceeded,
    RankPlacement,
    TaskStarted,
    TopologySpec,
)
from schemas.leadership import LeaderElected
from schemas.nodes import GpuUnhealthy, NodeDrainRequested, NodeLost
from schemas.teams import TeamCreated
from tests.core.builders import History, a_job

T = 1_700_000_000.0


def audit(events: Sequence[Event], epochs: dict[int, int] | None = None) -> list[Violation]:
    auditor = Auditor()
    for position, event in enumerate(events):
        auditor.observe(event, position, T + position, (epochs or {}).get(position))
    return auditor.violations


def cluster(spec: str = "2x8:2:1") -> list[Event]:
    return list(parse_cluster_spec(spec))


def submitted(job_id: str, gpus: int = 8, tasks: int = 1, **spec: object) -> list[Event]:
    job = JobSpec.model_validate(
        {"name": job_id, "team": "t", "gpus_per_task": gpus, "tasks": tasks, **spec}
    )
    return [
        JobSubmitted(job_id=job_id, spec=job, submitted_by="u"),
        JobAdmitted(job_id=job_id, queue="t", priority="research"),
    ]


def gang(job_id: str, *ranks: tuple[str, list[int]], attempt: int = 1) -> GangReserved:
    return GangReserved(
        job_id=job_id,
        attempt=attempt,
        ranks=[
            RankPlacement(rank=i, node_id=node, gpus=gpus) for i, (node, gpus) in enumerate(ranks)
        ],
    )


def invariants(violations: list[Violation]) -> set[int]:
    return {v.invariant for v in violations}


def test_a_clean_scheduler_history_has_no_violations() -> None:
    history = History("4x8:4:1")
    history.team("a", guaranteed=8)
    history.submit(*(a_job().gpus(4).tasks(2) for _ in range(6)))
    history.run(cycles=3)

    assert history.auditor.violations == []


def test_a_gpu_bound_to_two_gangs_violates_invariant_1_with_both_positions() -> None:
    events = [
        *cluster(),
        *submitted("a", gpus=2),
        *submitted("b", gpus=2),
        gang("a", ("n0000", [0, 1])),
        gang("b", ("n0000", [1, 2])),
    ]

    violations = audit(events)

    assert invariants(violations) == {1}
    assert violations[0].positions == (len(events) - 2, len(events) - 1)


def test_a_released_gpu_may_be_bound_again() -> None:
    events = [
        *cluster(),
        *submitted("a", gpus=2),
        *submitted("b", gpus=2),
        gang("a", ("n0000", [0, 1])),
        JobSucceeded(job_id="a", attempt=1),
        gang("b", ("n0000", [0, 1])),
    ]

    assert audit(events) == []


def test_a_partial_gang_violates_invariant_2() -> None:
    events = [*cluster(), *submitted("a", gpus=8, tasks=2), gang("a", ("n0000", list(range(8))))]

    assert invariants(audit(events)) == {2}


def test_a_rank_with_the_wrong_gpu_count_violates_invariant_2() -> None:
    events = [*cluster(), *submitted("a", gpus=4), gang("a", ("n0000", [0, 1]))]

    assert invariants(audit(events)) == {2}


def test_a_tp_group_across_nodes_violates_invariant_2() -> None:
    job = JobSpec(name="a", team="t", gpus_per_task=4, tasks=2, topology=TopologySpec(tp_size=8))
    events = [
        *cluster(),
        JobSubmitted(job_id="a", spec=job, submitted_by="u"),
        gang("a", ("n0000", [0, 1, 2, 3]), ("n0001", [0, 1, 2, 3])),
    ]

    assert invariants(audit(events)) == {2}


def test_a_second_gang_while_the_first_is_bound_violates_invariant_2() -> None:
    events = [
        *cluster(),
        *submitted("a", gpus=2),
        gang("a", ("n0000", [0, 1])),
        gang("a", ("n0001", [0, 1]), attempt=2),
    ]

    assert invariants(audit(events)) == {2}


def test_placing_on_a_lost_node_violates_invariant_3() -> None:
    events = [
        *cluster(),
        NodeLost(node_id="n0001", reason="gone"),
        *submitted("a"),
        gang("a", ("n0001", list(range(8)))),
    ]

    assert invariants(audit(events)) == {3}


def test_placing_on_a_draining_node_violates_invariant_3() -> None:
    events = [
        *cluster(),
        NodeDrainRequested(node_id="n0000", reason="r", by="h"),
        *submitted("a", gpus=1),
        gang("a", ("n0000", [0])),
    ]

    assert invariants(audit(events)) == {3}


def test_placing_on_an_unhealthy_gpu_violates_invariant_3() -> None:
    events = [
        *cluster(),
        GpuUnhealthy(node_id="n0000", gpu_index=2, reason="xid"),
        *submitted("a", gpus=1),
        gang("a", ("n0000", [2])),
    ]

    assert invariants(audit(events)) == {3}


def test_guarantees_beyond_the_cluster_violate_invariant_4() -> None:
    teams = [TeamCreated(name=n, guaranteed_gpus=10, token_sha256="0" * 64) for n in "abc"]

    violations = audit([*cluster(), *teams])  # 30 GPUs promised on 16

    assert invariants(violations) == {4}
    assert len(violations) == 1


def test_a_job_within_its_guarantee_starved_while_borrowers_run_violates_invariant_4() -> None:
    auditor = Auditor(reclaim_within_s=600)
    events: list[Event] = [
        *cluster(),
        TeamCreated(name="owner", guaranteed_gpus=8, token_sha256="0" * 64),
        TeamCreated(name="t", guaranteed_gpus=0, token_sha256="0" * 64),
        *submitted("b1"),
        *submitted("b2"),
        gang("b1", ("n0000", list(range(8)))),
        gang("b2", ("n0001", list(range(8)))),
    ]
    spec = JobSpec(name="o", team="owner", gpus_per_task=8)
    events += [
        JobSubmitted(job_id="o", spec=spec, submitted_by="u"),
        JobAdmitted(job_id="o", queue="owner", priority="research"),
    ]
    for position, event in enumerate(events):
        auditor.observe(event, position, T, None)
    auditor.observe(JobDeferred(job_id="o", code="no_capacity", message="m"), 100, T, None)
    assert auditor.violations == []

    auditor.observe(JobDeferred(job_id="o", code="no_capacity", message="m2"), 101, T + 601, None)

    assert invariants(auditor.violations) == {4}


def test_decisions_about_a_job_never_submitted_violate_invariant_5() -> None:
    events = [*cluster(), gang("ghost", ("n0000", [0]))]

    assert 5 in invariants(audit(events))


def test_decisions_after_a_job_finished_violate_invariant_5() -> None:
    events = [
        *cluster(),
        *submitted("a", gpus=1),
        gang("a", ("n0000", [0])),
        JobSucceeded(job_id="a", attempt=1),
        JobRequeued(job_id="a", attempt=1, code="preempted", reason="r"),
    ]

    assert invariants(audit(events)) == {5}


def test_an_admitted_job_without_a_reason_is_reported_unexplained() -> None:
    auditor = Auditor()
    for position, event in enumerate([*cluster(), *submitted("a"), *submitted("b")]):
        auditor.observe(event, position, T, None)
    auditor.observe(JobDeferred(job_id="b", code="no_capacity", message="m"), 99, T, None)

    auditor.check_explained(100)

    assert auditor.unexplained() == ["a"]
    assert invariants(auditor.violations) == {5}


def test_a_write_from_a_deposed_leader_violates_invariant_6() -> None:
    events = [
        *cluster(),
        LeaderElected(epoch=1, leader_id="x"),
        *submitted("a", gpus=1),
        LeaderElected(epoch=2, leader_id="y"),
        gang("a", ("n0000", [0])),
    ]
    gang_position = len(events) - 1

    violations = audit(events, epochs={gang_position: 1})

    assert invariants(violations) == {6}
    assert violations[0].positions == (gang_position - 1, gang_position)


def test_a_write_from_the_current_leader_is_accepted() -> None:
    events = [
        *cluster(),
        LeaderElected(epoch=1, leader_id="x"),
        *submitted("a", gpus=1),
        LeaderElected(epoch=2, leader_id="y"),
        gang("a", ("n0000", [0])),
    ]

    assert audit(events, epochs={len(events) - 1: 2}) == []


def test_an_epoch_that_does_not_rise_violates_invariant_6() -> None:
    events = [LeaderElected(epoch=3, leader_id="x"), LeaderElected(epoch=3, leader_id="y")]

    assert invariants(audit(events)) == {6}


def test_a_gpu_given_while_an_old_rank_still_runs_on_it_is_flagged() -> None:
    auditor = Auditor()
    events: list[Event] = [
        *parse_cluster_spec("1x8"),
        JobSubmitted(
            job_id="a", spec=JobSpec(name="a", team="t", gpus_per_task=8), submitted_by="t"
        ),
        JobSubmitted(
            job_id="b", spec=JobSpec(name="b", team="t", gpus_per_task=8), submitted_by="t"
        ),
        GangReserved(
            job_id="a",
            attempt=1,
            ranks=[RankPlacement(rank=0, node_id="n0000", gpus=list(range(8)))],
        ),
        TaskStarted(job_id="a", attempt=1, rank=0, node_id="n0000"),
        JobCancelled(job_id="a", attempt=1, reason="cancelled by request"),
        GangReserved(
            job_id="b",
            attempt=1,
            ranks=[RankPlacement(rank=0, node_id="n0000", gpus=list(range(8)))],
        ),
    ]
    for position, event in enumerate(events):
        auditor.observe(event, position, 0.0, None)
    assert [v.invariant for v in auditor.violations].count(1) == 8
    assert "while rank 0 of job a attempt 1 still runs on it" in auditor.violations[0].message
