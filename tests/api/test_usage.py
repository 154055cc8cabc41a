"""Showback as a specification: the usage book folded from a job's history at known times,
cut into days and weeks. Allocated runs from the reservation to the release; used, while every
rank runs."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import uuid4

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from schemas.base import Event
from schemas.checkpoints import CheckpointCommitted, CheckpointShard
from schemas.envelope import EventEnvelope
from schemas.jobs import (
    GangReserved,
    JobAdmitted,
    JobRequeued,
    JobSucceeded,
    MigSlice,
    PreemptionRequested,
    RankPlacement,
    ReservationPlanned,
    TaskStarted,
)
from services.api.observability import ObservabilityCollector, unusable_free_gpus
from services.api.projections.model import ReadModels
from services.api.projections.usage import preemption_cause, report
from services.runtime import EventStore
from tests.api.builders import node, reserved, submitted
from tests.api.conftest import Api

MIDNIGHT = datetime(2026, 11, 16, tzinfo=UTC)  # a Monday


class Clock:
    """Records events at the times a test says, like the store would (versions, positions)."""

    def __init__(self) -> None:
        self.models = ReadModels()
        self.versions: dict[str, int] = {}
        self.position = 0

    def at(self, hours: float, *events: Event) -> None:
        for event in events:
            self.position += 1
            version = self.versions[event.stream] = self.versions.get(event.stream, 0) + 1
            self.models.apply(
                EventEnvelope(
                    event_id=uuid4(),
                    stream=event.stream,
                    version=version,
                    position=self.position,
                    type=event.type,
                    schema_version=event.schema_version,
                    payload=event,
                    recorded_at=MIDNIGHT + timedelta(hours=hours),
                    producer="tests",
                )
            )


def started(job_id: str, ranks: int, attempt: int = 1) -> list[Event]:
    return [TaskStarted(job_id=job_id, attempt=attempt, rank=r, node_id="n1") for r in range(ranks)]


def test_allocated_from_reservation_to_release_used_while_all_ranks_run() -> None:
    clock = Clock()
    clock.at(0, node("n1"), submitted("j1", tasks=2, gpus_per_task=2))
    clock.at(1, JobAdmitted(job_id="j1", queue="nlp", priority="research"))
    clock.at(2, reserved("j1", [("n1", [0, 1]), ("n1", [2, 3])]))  # 4 GPUs held from 02:00
    clock.at(3, *started("j1", 1))
    clock.at(4, *started("j1", 2)[1:])  # all ranks run from 04:00
    clock.at(10, JobSucceeded(job_id="j1", attempt=1))
    [row] = report(
        clock.models.usage,
        start=MIDNIGHT,
        end=MIDNIGHT + timedelta(days=1),
        by="day",
        now=MIDNIGHT + timedelta(days=2),
    )
    assert (row.team, row.gpu_type, row.period_start) == ("nlp", "H100", MIDNIGHT)
    assert row.allocated_gpu_hours == 4 * 8
    assert row.used_gpu_hours == 4 * 6


def test_a_slice_is_shown_back_as_its_seventh_of_a_gpu() -> None:
    clock = Clock()
    clock.at(0, node("n1"), submitted("s1", tasks=1, gpus_per_task=0, mig_profile="1g.10gb"))
    clock.at(0, JobAdmitted(job_id="s1", queue="nlp", priority="research"))
    slice_ = RankPlacement(rank=0, node_id="n1", gpus=[0], mig=MigSlice(profile="1g.10gb", start=3))
    clock.at(0, GangReserved(job_id="s1", attempt=1, ranks=[slice_]), *started("s1", 1))
    clock.at(7, JobSucceeded(job_id="s1", attempt=1))
    [row] = report(
        clock.models.usage,
        start=MIDNIGHT,
        end=MIDNIGHT + timedelta(days=1),
        by="day",
        now=MIDNIGHT + timedelta(days=1),
    )
    # Seven hours of a seventh of a GPU: one GPU-hour allocated and used.
    assert row.allocated_gpu_hours == pytest.approx(1.0)
    assert row.used_gpu_hours == pytest.approx(1.0)


def test_a_running_gang_is_split_at_midnight_and_counts_up_to_now() -> None:
    clock = Clock()
    clock.at(0, node("n1"), submitted("j1", tasks=1, gpus_per_task=8))
    clock.at(20, JobAdmitted(job_id="j1", queue="nlp", priority="research"))
    clock.at(20, reserved("j1", [("n1", list(range(8)))]), *started("j1", 1))
    rows = report(
        clock.models.usage,
        start=MIDNIGHT,
        end=MIDNIGHT + timedelta(days=7),
        by="day",
        now=MIDNIGHT + timedelta(hours=30),
    )
    assert [(r.period_start.day, r.allocated_gpu_hours) for r in rows] == [(16, 32), (17, 48)]
    [week] = report(
        clock.models.usage,
        start=MIDNIGHT + timedelta(hours=21),
        end=MIDNIGHT + timedelta(days=7),
        by="week",
        now=MIDNIGHT + timedelta(hours=30),
    )
    assert week.period_start == MIDNIGHT  # weeks start on Monday
    assert week.allocated_gpu_hours == week.used_gpu_hours == 8 * 9


def test_a_preempted_attempt_stops_counting_at_its_requeue_and_teams_are_apart() -> None:
    clock = Clock()
    clock.at(0, node("n1"), submitted("j1", tasks=1, gpus_per_task=2))
    clock.at(0, submitted("j2", team="vision", tasks=1, gpus_per_task=4))
    clock.at(0, JobAdmitted(job_id="j1", queue="nlp", priority="best-effort"))
    clock.at(0, JobAdmitted(job_id="j2", queue="vision", priority="production"))
    clock.at(1, reserved("j1", [("n1", [0, 1])]), *started("j1", 1))
    clock.at(
        3,
        PreemptionRequested(
            job_id="j1", attempt=1, preemptor_job_id="j2", reason="for j2", grace_s=60
        ),
    )
    clock.at(4, JobRequeued(job_id="j1", attempt=1, code="preempted", reason="for j2"))
    clock.at(4, reserved("j2", [("n1", [0, 1, 2, 3])]), *started("j2", 1))
    clock.at(5, JobSucceeded(job_id="j2", attempt=1))
    rows = report(
        clock.models.usage,
        start=MIDNIGHT,
        end=MIDNIGHT + timedelta(days=1),
        by="day",
        now=MIDNIGHT + timedelta(days=1),
    )
    # j1 held 2 GPUs for 3 h, its rank ran through the checkpoint: used the same 3 h.
    assert [(r.team, r.allocated_gpu_hours, r.used_gpu_hours) for r in rows] == [
        ("nlp", 6, 6),
        ("vision", 4, 4),
    ]
    only_vision = report(
        clock.models.usage,
        start=MIDNIGHT,
        end=MIDNIGHT + timedelta(days=1),
        by="day",
        now=MIDNIGHT + timedelta(days=1),
        teams={"vision"},
    )
    assert [r.team for r in only_vision] == ["vision"]


@pytest.mark.integration
async def test_the_usage_route_shows_a_team_its_own_and_the_admin_everything(
    api: Api, store: EventStore
) -> None:
    await store.append("node-n1", 0, [node("n1")])
    for team, gpus in (("nlp", [0, 1]), ("vision", [2, 3, 4])):
        job_id = await api.submit(
            api.teams.get(team) or await api.create_team(team, guaranteed_gpus=len(gpus)),
            team=team,
            tasks=1,
            gpus_per_task=len(gpus),
        )
        await store.append(
            f"job-{job_id}",
            1,
            [
                JobAdmitted(job_id=job_id, queue=team, priority="research"),
                reserved(job_id, [("n1", gpus)]),
                TaskStarted(job_id=job_id, attempt=1, rank=0, node_id="n1"),
            ],
        )
    admin = api.as_admin()
    async with asyncio.timeout(30):
        while True:  # written as the scheduler would: the API reads them a moment later
            if len((await api.client.get("/v1/usage", headers=admin)).json()["items"]) == 2:
                break
            await asyncio.sleep(0.05)

    mine = (await api.client.get("/v1/usage", headers=api.teams["nlp"])).json()
    assert {i["team"] for i in mine["items"]} == {"nlp"}
    assert [t["team"] for t in mine["teams"]] == ["nlp"]
    [item] = mine["items"]
    assert item["gpu_type"] == "H100"
    assert 0 < item["used_gpu_hours"] <= item["allocated_gpu_hours"]
    assert mine["teams"][0]["guaranteed_gpus"] == 2
    assert mine["by"] == "day"

    everyone = (await api.client.get("/v1/usage", headers=admin, params={"by": "week"})).json()
    assert [t["team"] for t in everyone["teams"]] == ["nlp", "vision"]
    vision = await api.client.get("/v1/usage", headers=admin, params={"team": "vision"})
    assert {i["team"] for i in vision.json()["items"]} == {"vision"}

    refused = await api.client.get("/v1/usage", headers=api.teams["nlp"], params={"team": "vision"})
    assert refused.status_code == 403
    assert "vision" not in str(refused.json().get("items", ""))
    for params in (
        {"from": "2026-11-20T00:00:00Z", "to": "2026-11-19T00:00:00Z"},
        {"from": "2000-01-01T00:00:00Z", "to": "2026-11-19T00:00:00Z"},
        {"from": "0001-01-01T00:00:00Z"},
        {"to": "9999-12-31T23:00:00Z", "by": "week"},
        {"by": "month"},
    ):
        bad = await api.client.get("/v1/usage", headers=admin, params=params)
        assert bad.status_code == 422, (params, bad.text)
        assert bad.headers["content-type"] == "application/problem+json"


def test_queue_waits_and_work_lost_since_the_last_checkpoint() -> None:
    clock = Clock()
    clock.at(0, node("n1"), submitted("j1", tasks=1, gpus_per_task=2))
    clock.at(1, JobAdmitted(job_id="j1", queue="nlp", priority="research"))
    clock.at(2, reserved("j1", [("n1", [0, 1])]), *started("j1", 1))  # waited 2 h
    clock.at(
        3,
        CheckpointCommitted(job_id="j1", attempt=1, checkpoint_id="c1", step=10, shards=[shard()]),
    )
    clock.at(
        4,
        PreemptionRequested(
            job_id="j1",
            attempt=1,
            preemptor_job_id="j9",
            reason="preempted for job j9 (priority production)",
            grace_s=0,
        ),
    )
    clock.at(5, JobRequeued(job_id="j1", attempt=1, code="preempted", reason="x"))
    clock.at(5.5, reserved("j1", [("n1", [0, 1])], attempt=2))  # waited 30 min
    book = clock.models.usage
    waits = book.waits[("research", "nlp")]
    assert (waits.count, waits.total_s) == (2, 2 * 3600 + 1800)
    # 2 GPUs ran 2 h past the checkpoint at 03:00 before the requeue at 05:00.
    assert book.lost_gpu_seconds == {("nlp", "preempted"): 2 * 2 * 3600}

    found = samples(clock.models)
    assert (
        found[
            (
                "gangway_queue_wait_seconds_bucket",
                ("le", "3600.0"),
                ("priority", "research"),
                ("team", "nlp"),
            )
        ]
        == 1
    )
    assert (
        found[("gangway_queue_wait_seconds_count", ("priority", "research"), ("team", "nlp"))] == 2
    )
    assert (
        found[("gangway_lost_gpu_seconds_total", ("cause", "preempted"), ("team", "nlp"))] == 14400
    )
    assert found[("gangway_team_gpus_allocated", ("gpu_type", "H100"), ("team", "nlp"))] == 2
    assert found[("gangway_jobs", ("state", "reserved"))] == 1
    preempted = (("priority", "research"), ("reason", "preempted"), ("team", "nlp"))
    assert found[("gangway_preemptions_total", *preempted)] == 1
    assert found[("gangway_requeues_total", ("reason", "preempted"), ("team", "nlp"))] == 1


def test_preemptions_and_requeues_are_counted_by_their_cause() -> None:
    clock = Clock()
    clock.at(0, node("n1"), node("n2"), submitted("j1", tasks=1, gpus_per_task=2))
    clock.at(0, JobAdmitted(job_id="j1", queue="nlp", priority="research"))
    clock.at(1, reserved("j1", [("n1", [0, 1])]), *started("j1", 1))
    # Its node drains: checkpoint and move (no preemptor), then requeued for the drain.
    drain = "node n1 is draining: checkpoint and move"
    clock.at(
        2,
        PreemptionRequested(job_id="j1", attempt=1, preemptor_job_id=None, reason=drain, grace_s=0),
    )
    clock.at(3, JobRequeued(job_id="j1", attempt=1, code="node_drained", reason=drain))
    # Then its second node is lost under it: a requeue without any preemption.
    clock.at(4, reserved("j1", [("n2", [0, 1])], attempt=2), *started("j1", 1, attempt=2))
    clock.at(5, JobRequeued(job_id="j1", attempt=2, code="node_lost", reason="n2 lost"))
    book = clock.models.usage
    assert book.preemptions == {("research", "nlp", "node_drained"): 1}
    assert book.requeues == {("nlp", "node_drained"): 1, ("nlp", "node_lost"): 1}


def test_waiting_jobs_past_their_estimated_start_are_counted_with_the_longest_delay() -> None:
    clock = Clock()
    clock.at(0, node("n1"))
    for job in ("late", "later", "on-time"):
        clock.at(0, submitted(job, tasks=1, gpus_per_task=8))
        clock.at(0, JobAdmitted(job_id=job, queue="nlp", priority="research"))
    clock.at(0, submitted("fresh", tasks=1, gpus_per_task=8))  # no estimate yet
    clock.at(0, JobAdmitted(job_id="fresh", queue="nlp", priority="production"))
    clock.at(0, planned("late", MIDNIGHT + timedelta(hours=2)))
    clock.at(0, planned("later", MIDNIGHT + timedelta(hours=5)))
    clock.at(0, planned("on-time", MIDNIGHT + timedelta(hours=9)))
    found = samples(clock.models, now=MIDNIGHT + timedelta(hours=8))
    research, production = ("priority", "research"), ("priority", "production")
    assert found[("gangway_pending_past_estimate_jobs", research)] == 2
    assert found[("gangway_pending_past_estimate_seconds", research)] == 6 * 3600
    assert found[("gangway_pending_past_estimate_jobs", production)] == 0
    assert found[("gangway_pending_past_estimate_seconds", production)] == 0


def planned(job_id: str, start_at: datetime) -> ReservationPlanned:
    return ReservationPlanned(job_id=job_id, start_at=start_at, nodes=["n1"])


@pytest.mark.parametrize(
    ("reason", "cause"),
    [
        ("preempted for job j2 (reclaiming guaranteed capacity)", "preempted"),
        ("preempted for job j2 (its reservation is overdue)", "preempted"),
        ("node n4 is draining: checkpoint and move", "node_drained"),
        ("suspended by request: checkpoint, then stop", "suspended"),
        ("ran past max_runtime_s (60 s): checkpoint, then stop", "max_runtime"),
        ("something new", "other"),
    ],
)
def test_a_preemptions_cause_is_one_of_a_few_labels(reason: str, cause: str) -> None:
    assert preemption_cause(reason) == cause


def test_free_gpus_no_waiting_task_fits_are_fragmentation() -> None:
    clock = Clock()
    clock.at(0, node("n1"), node("n2"), submitted("small", tasks=1, gpus_per_task=6))
    clock.at(0, JobAdmitted(job_id="small", queue="nlp", priority="research"))
    clock.at(0, reserved("small", [("n1", list(range(6)))]))
    assert unusable_free_gpus(clock.models) == (10, 0)  # nothing waits
    clock.at(1, submitted("big", tasks=1, gpus_per_task=4))
    # n1's 2 free GPUs fit no waiting task of 4; n2's 8 do.
    assert unusable_free_gpus(clock.models) == (10, 2)
    found = samples(clock.models)
    assert found[("gangway_gpus_free_unusable",)] == 2
    assert found[("gangway_gpus_free_unusable_ratio",)] == 0.2


def samples(models: ReadModels, now: datetime | None = None) -> dict[tuple[Any, ...], float]:
    """What a scrape of the collector shows: (name, sorted label pairs…) -> value."""
    registry = CollectorRegistry()
    if now is None:
        registry.register(ObservabilityCollector(lambda: models))
    else:
        registry.register(ObservabilityCollector(lambda: models, clock=lambda: now))
    text = generate_latest(registry).decode()
    return {
        (sample.name, *sorted(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def shard() -> CheckpointShard:
    return CheckpointShard(rank=0, uri="file:///c1/0", sha256="0" * 64, bytes=1)
