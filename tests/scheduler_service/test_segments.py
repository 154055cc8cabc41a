"""How the scheduler service turns a cycle's decisions into appends: order and versions kept."""

from __future__ import annotations

from core.policy import SchedulingPolicy
from schemas.base import Event
from schemas.jobs import (
    GangReserved,
    JobCancelled,
    JobDeferred,
    JobRequeued,
    JobResumed,
    PreemptionRequested,
    RankPlacement,
)
from services.scheduler.folding import Folded
from services.scheduler.service import segments
from tests.core.builders import History, a_job


def folded_with(versions: dict[str, int]) -> Folded:
    folded = Folded.empty(SchedulingPolicy())
    folded.versions.update(versions)
    return folded


Parts = list[list[tuple[str, int | None, list[Event]]]]


def flatten(parts: Parts) -> list[Event]:
    return [event for part in parts for _, _, events in part for event in events]


def as_tuples(
    folded: Folded, decisions: list[Event]
) -> list[list[tuple[str, int | None, list[Event]]]]:
    return [
        [(a.stream, a.expected_version, list(a.events)) for a in part]
        for part in segments(decisions, folded)
    ]


GANG = [RankPlacement(rank=0, node_id="n0000", gpus=[0, 1])]


def x_cancelled(*, started: bool) -> History:
    """x's 8-GPU gang on the one node, its rank started or not, then cancelled."""
    history = History("1x8:1:1")
    history.submit(a_job("x").gpus(8))
    history.cycle()
    if started:
        history.start("x")
    history.cancel("x")
    history.cycle()
    return history


def test_decisions_on_distinct_streams_are_one_append_in_their_order() -> None:
    decisions: list[Event] = [
        JobRequeued(job_id="b", attempt=1, code="preempted", reason="r"),
        GangReserved(job_id="a", attempt=1, ranks=GANG),
        JobDeferred(job_id="c", code="no_capacity", message="m"),
    ]
    parts = as_tuples(folded_with({"job-a": 2, "job-b": 7}), decisions)
    assert [[(stream, version) for stream, version, _ in part] for part in parts] == [
        [("job-b", 7), ("job-a", 2), ("job-c", 0)]
    ]
    assert flatten(parts) == decisions


def test_a_stream_that_comes_back_after_another_starts_a_new_segment_keeping_the_order() -> None:
    # A's resume, B's release, then A's gang on the GPUs B released: B's release must be
    # recorded (and folded) before A's binding.
    decisions: list[Event] = [
        JobResumed(job_id="a"),
        JobRequeued(job_id="b", attempt=1, code="preempted", reason="r"),
        GangReserved(job_id="a", attempt=1, ranks=GANG),
    ]
    parts = as_tuples(folded_with({"job-a": 3, "job-b": 5}), decisions)
    assert [[(stream, version) for stream, version, _ in part] for part in parts] == [
        [("job-a", 3), ("job-b", 5)],
        [("job-a", 4)],
    ]
    assert flatten(parts) == decisions


def test_consecutive_decisions_of_one_stream_share_one_append() -> None:
    decisions: list[Event] = [
        JobResumed(job_id="a"),
        GangReserved(job_id="a", attempt=1, ranks=GANG),
    ]
    parts = as_tuples(folded_with({"job-a": 1}), decisions)
    assert [[(stream, version, len(events)) for stream, version, events in p] for p in parts] == [
        [("job-a", 1, 2)]
    ]


def test_a_gang_on_gpus_a_released_rank_may_still_start_on_expects_that_jobs_stream() -> None:
    # x's gang was reserved and cancelled before its rank started: its agent may start it
    # late, so y's binding of those GPUs expects x's stream as folded (a guard, no event).
    history = x_cancelled(started=False)
    folded = Folded(history.state, versions={"job-x": 9, "job-y": 2})
    on_x = [RankPlacement(rank=0, node_id="n0000", gpus=[2, 3])]
    decisions: list[Event] = [
        JobDeferred(job_id="z", code="no_capacity", message="m"),
        GangReserved(job_id="y", attempt=1, ranks=on_x),
    ]
    parts = as_tuples(folded, decisions)
    assert parts == [[("job-z", 0, decisions[:1]), ("job-y", 2, decisions[1:]), ("job-x", 9, [])]]


def test_no_guard_once_the_released_rank_cannot_start_there() -> None:
    history = x_cancelled(started=True)
    history.stop_released(history.events(JobCancelled, "x"))
    folded = Folded(history.state, versions={"job-x": 9, "job-y": 2})
    decisions: list[Event] = [GangReserved(job_id="y", attempt=1, ranks=GANG)]
    assert as_tuples(folded, decisions) == [[("job-y", 2, decisions)]]


def test_a_guarded_stream_written_in_the_same_append_is_not_named_twice() -> None:
    history = x_cancelled(started=False)
    folded = Folded(history.state, versions={"job-x": 9, "job-y": 2})
    decisions: list[Event] = [
        JobDeferred(job_id="x", code="no_capacity", message="m"),
        GangReserved(job_id="y", attempt=1, ranks=GANG),
    ]
    assert as_tuples(folded, decisions) == [
        [("job-x", 9, decisions[:1]), ("job-y", 2, decisions[1:])]
    ]


def test_a_preemption_decided_while_released_ranks_linger_expects_their_streams() -> None:
    # attack4: x was cancelled with its rank running; a cycle folded before x's TaskExited saw
    # its GPUs held and preempted v for p, though x's rank had exited by the append (the
    # auditor's idle_capacity rule, log position 896). The preemption expects x's stream as
    # folded: an exit appended meanwhile makes the cycle conflict and decide again.
    history = x_cancelled(started=True)
    folded = Folded(history.state, versions={"job-x": 9, "job-v": 4, "job-p": 2})
    decisions: list[Event] = [
        PreemptionRequested(job_id="v", attempt=1, preemptor_job_id="p", reason="r", grace_s=120.0),
        JobDeferred(job_id="p", code="preempting", message="m"),
    ]
    assert as_tuples(folded, decisions) == [
        [("job-v", 4, decisions[:1]), ("job-p", 2, decisions[1:]), ("job-x", 9, [])]
    ]


def test_no_lingering_guard_without_a_preemption_or_once_the_rank_exited() -> None:
    history = x_cancelled(started=True)
    folded = Folded(history.state, versions={"job-x": 9, "job-v": 4, "job-p": 2})
    deferred: list[Event] = [JobDeferred(job_id="p", code="no_capacity", message="m")]
    assert as_tuples(folded, deferred) == [[("job-p", 2, deferred)]]
    history.stop_released(history.events(JobCancelled, "x"))
    folded = Folded(history.state, versions={"job-x": 9, "job-v": 4, "job-p": 2})
    preempting: list[Event] = [
        PreemptionRequested(job_id="v", attempt=1, preemptor_job_id="p", reason="r", grace_s=1.0)
    ]
    assert as_tuples(folded, preempting) == [[("job-v", 4, preempting)]]
