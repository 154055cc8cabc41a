"""The read models as a whole: idempotence, ordering, indexes and cluster totals."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.base import Event
from schemas.envelope import EventEnvelope
from schemas.jobs import JobAdmitted, JobDeferred, JobSucceeded, TaskStarted
from schemas.nodes import GpuUnhealthy, NodeLost
from schemas.teams import QueueConfigured, TeamCreated
from services.api.projections.cluster import summarize
from services.api.projections.model import Outcome, ReadModels, Watermark
from tests.api.builders import Log, node, reserved, submitted

SHA = "ab" * 32


def test_a_redelivered_event_is_applied_once() -> None:
    models = ReadModels()
    envelopes = Log().record(submitted("j1"), JobAdmitted(job_id="j1", queue="q", priority="p"))
    models.apply_all(envelopes)
    assert models.apply(envelopes[1]) is Outcome.DUPLICATE
    assert models.events_applied == 2


def test_an_event_beyond_a_stream_gap_is_not_applied() -> None:
    envelopes = Log().record(submitted("j1"), JobAdmitted(job_id="j1", queue="q", priority="p"))
    models = ReadModels()
    assert models.apply(envelopes[1]) is Outcome.GAP
    assert "j1" not in models.jobs


def test_watermark_advances_only_over_contiguous_positions() -> None:
    watermark = Watermark()
    for position in (1, 3, 4):
        watermark.mark(position)
    assert watermark.position == 1
    watermark.mark(2)
    assert watermark.position == 4


def test_watermark_covers_every_applied_position_and_no_other() -> None:
    watermark = Watermark()
    for position in (1, 2, 5):
        watermark.mark(position)
    assert [p for p in range(1, 8) if watermark.covers(p)] == [1, 2, 5]


def test_a_reserved_gang_is_allocated_on_its_nodes_until_it_finishes() -> None:
    log = Log()
    models = ReadModels()
    models.apply_all(
        log.record(
            node("n1"),
            submitted("j1", tasks=1, gpus_per_task=4),
            JobAdmitted(job_id="j1", queue="nlp", priority="research"),
            reserved("j1", [("n1", [0, 1, 2, 3])]),
        )
    )
    assert dict(models.allocated_on("n1")) == {"j1": (0, 1, 2, 3)}
    assert models.allocated_by_queue["nlp"] == 4
    models.apply_all(log.record(JobSucceeded(job_id="j1", attempt=1)))
    assert dict(models.allocated_on("n1")) == {}
    assert models.allocated_by_queue["nlp"] == 0


def test_a_team_is_known_by_its_token_hash_and_gets_its_queue() -> None:
    models = ReadModels()
    models.apply_all(
        Log().record(TeamCreated(name="nlp", guaranteed_gpus=8, max_gpus=16, token_sha256=SHA))
    )
    assert models.team_by_token_sha256[SHA] == "nlp"
    assert models.queues["nlp"].guaranteed_gpus == 8


def test_queue_configuration_replaces_the_teams_initial_quota() -> None:
    models = ReadModels()
    models.apply_all(
        Log().record(
            TeamCreated(name="nlp", guaranteed_gpus=8, token_sha256=SHA),
            QueueConfigured(name="nlp", guaranteed_gpus=16, max_gpus=64, weight=2.0),
        )
    )
    queue = models.queues["nlp"]
    assert (queue.guaranteed_gpus, queue.max_gpus, queue.weight) == (16, 64, 2.0)


def test_pending_jobs_are_counted_by_class() -> None:
    models = ReadModels()
    models.apply_all(
        Log().record(
            submitted("j1", priority="production"),
            submitted("j2", priority="research"),
            submitted("j3", priority="research"),
        )
    )
    assert summarize(models).pending_by_class == {"production": 1, "research": 2}


def test_fragmentation_is_the_share_of_free_gpus_outside_whole_free_nodes() -> None:
    models = ReadModels()
    models.apply_all(
        Log().record(
            node("n1"),
            node("n2"),
            submitted("j1", tasks=1, gpus_per_task=4),
            reserved("j1", [("n1", [0, 1, 2, 3])]),
        )
    )
    summary = summarize(models)
    # 12 free: 4 on n1 (partly used) and 8 on n2 (wholly free).
    assert (summary.total_gpus, summary.allocated_gpus, summary.free_gpus) == (16, 4, 12)
    assert summary.fragmentation == round(4 / 12, 4)


def test_gpus_of_lost_nodes_and_unhealthy_gpus_are_not_healthy() -> None:
    models = ReadModels()
    models.apply_all(
        Log().record(
            node("n1"),
            node("n2"),
            NodeLost(node_id="n1", reason="no heartbeat"),
            GpuUnhealthy(node_id="n2", gpu_index=3, reason="ECC"),
        )
    )
    summary = summarize(models)
    assert (summary.total_gpus, summary.healthy_gpus, summary.free_gpus) == (16, 7, 7)


def _job_history(job: str) -> list[Event]:
    return [
        submitted(job),
        JobAdmitted(job_id=job, queue="nlp", priority="research"),
        JobDeferred(job_id=job, code="no_capacity", message="waiting"),
        reserved(job, [(f"n-{job}", [0, 1, 2, 3]), (f"m-{job}", [0, 1, 2, 3])]),
        TaskStarted(job_id=job, attempt=1, rank=0, node_id=f"n-{job}"),
        TaskStarted(job_id=job, attempt=1, rank=1, node_id=f"m-{job}"),
    ]


_LOG = Log()
_ENVELOPES: list[EventEnvelope] = _LOG.record(
    *[event for job in ("a", "b", "c") for event in _job_history(job)]
)


@settings(max_examples=60, deadline=None)
@given(st.permutations(_ENVELOPES), st.lists(st.sampled_from(_ENVELOPES), max_size=6))
def test_bus_order_and_redelivery_give_the_log_order_state(
    shuffled: list[EventEnvelope], repeats: list[EventEnvelope]
) -> None:
    """Whatever order the bus delivers in (each stream in order) and whatever it repeats, the
    models, with gaps filled from the log as the feed does, equal a replay of the log."""
    replayed = ReadModels()
    replayed.apply_all(_ENVELOPES)
    fed = ReadModels()
    by_stream: dict[str, list[EventEnvelope]] = {}
    for envelope in _ENVELOPES:
        by_stream.setdefault(envelope.stream, []).append(envelope)
    for envelope in [*shuffled, *repeats]:
        if fed.apply(envelope) is Outcome.GAP:
            fed.apply_all(
                e for e in by_stream[envelope.stream] if e.version > fed.version_of(e.stream)
            )
    assert fed.jobs == replayed.jobs
    assert fed.allocations == replayed.allocations
    assert fed.watermark.position == replayed.watermark.position == len(_ENVELOPES)
