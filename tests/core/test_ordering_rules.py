"""Who goes first, rule by rule (DESIGN §3 "Order within a class", "Aging bounds the wait").

Fair share is a queue's time-decayed GPU usage over its entitlement (its guarantee, else one GPU)
times its weight; aging counts from when a job last began waiting; the order's tiers are: a
preemptor whose victims are gone, then aged jobs oldest first, then jobs within their queue's
guarantee before borrowers, then class, fair share and age.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator

import pytest

from core import SchedulingPolicy
from core.ordering import fair_share, gangway_key, is_aged
from core.state import CoreJob, QueueRecord
from schemas.jobs import GangReserved
from tests.core.builders import T0, History, a_job

HALF_LIFE = 86400.0
POLICY = SchedulingPolicy(fair_share_half_life_s=HALF_LIFE, aging_max_wait_s=600.0)


def _waiting(seq: int, submitted_at: float, queued_at: float | None) -> CoreJob:
    return CoreJob(
        job_id=f"job-{seq}",
        seq=seq,
        spec=None,
        state="queued",
        shape=None,
        submitted_at=submitted_at,
        queued_at=queued_at,
    )


def test_fair_share_is_decayed_average_gpus_over_guarantee_times_weight() -> None:
    # 8 GPUs held for one half-life, from no earlier usage: the decayed average is 4 GPUs;
    # over a guarantee of 2 GPUs at weight 2 the share is exactly 1.
    queue = QueueRecord(
        name="vision", guaranteed_gpus=2, weight=2.0, allocated=8, usage_at=T0 - HALF_LIFE
    )

    assert fair_share(queue, T0, POLICY) == pytest.approx(1.0)


def test_fair_share_of_a_queue_without_guarantee_is_counted_against_one_gpu() -> None:
    # Usage recorded just now, nothing held: the share is the decayed average (3 GPUs) over an
    # entitlement of one GPU.
    usage = 3.0 * HALF_LIFE / math.log(2)
    queue = QueueRecord(name="adhoc", decayed_usage=usage, usage_at=T0)

    assert fair_share(queue, T0, POLICY) == pytest.approx(3.0)


def test_past_usage_halves_every_half_life_so_old_usage_is_not_punished_forever() -> None:
    usage = 4.0 * HALF_LIFE / math.log(2)
    queue = QueueRecord(name="adhoc", decayed_usage=usage, usage_at=T0)

    assert fair_share(queue, T0 + HALF_LIFE, POLICY) == pytest.approx(2.0)
    assert fair_share(queue, T0 + 2 * HALF_LIFE, POLICY) == pytest.approx(1.0)


def test_a_queue_with_no_record_has_used_nothing() -> None:
    assert fair_share(None, T0, POLICY) == 0.0


def test_a_job_is_aged_exactly_when_it_has_waited_the_policys_maximum_since_it_last_queued() -> (
    None
):
    requeued = _waiting(1, submitted_at=T0, queued_at=T0 + 100.0)

    assert not is_aged(requeued, T0 + 699.0, POLICY)
    assert is_aged(requeued, T0 + 700.0, POLICY)


def test_a_preemptor_whose_victims_are_gone_goes_first_higher_class_first() -> None:
    low = gangway_key(_waiting(1, T0, T0), -10, 0.0, False, True, False)
    high = gangway_key(_waiting(2, T0, T0), 300, 0.0, False, True, False)
    aged = gangway_key(_waiting(3, T0, T0), 300, 0.0, True, False, True)

    assert sorted([aged, low, high]) == [high, low, aged]


def test_aged_jobs_go_before_any_class_oldest_wait_first_not_first_arrived() -> None:
    # Job 1 arrived first but was requeued later: it has waited less than job 2.
    requeued = gangway_key(_waiting(1, T0, T0 + 500.0), 0, 0.0, True, False, False)
    patient = gangway_key(_waiting(2, T0 + 10.0, T0 + 10.0), 0, 0.0, True, False, False)
    critical = gangway_key(_waiting(3, T0 + 20.0, T0 + 20.0), 300, 0.0, False, False, True)

    assert sorted([critical, requeued, patient]) == [patient, requeued, critical]


def test_the_cycle_wakes_when_the_first_waiting_job_will_have_aged() -> None:
    # Nothing runs and the one job can never fit: the only moment the next cycle could decide
    # something new is when that job becomes aged (and its wait is bounded).
    history = History("1x8:1:1", policy=SchedulingPolicy(aging_max_wait_s=600.0))
    history.submit(a_job().gpus(8).tasks(2))
    history.advance(30)

    history.cycle()

    assert history.cycles[-1].next_wakeup == T0 + 600.0
    assert history.cycles[-1].considered == 1


@pytest.fixture
def tokyo_host(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A scheduler host whose local time zone is not UTC."""
    monkeypatch.setenv("TZ", "Asia/Tokyo")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


@pytest.mark.usefixtures("tokyo_host")
def test_a_job_in_its_retry_backoff_says_until_when_in_utc_whatever_the_hosts_zone() -> None:
    policy = SchedulingPolicy(retry_backoff_base_s=30, retry_backoff_cap_s=600)
    history = History("1x8:1:1", policy=policy)
    job = history.submit(a_job("job-backoff").gpus(8).retries(3))[0]
    history.run()
    history.exit(job, 1)

    history.run(cycles=2)

    # The jittered backoff of job-backoff's first failure ends 24.9 s after it (T0 + 24.9 s).
    assert history.job(job).reason == (
        "needs 8 GPUs in one NVLink domain; attempt 1 failed; "
        "the next attempt may start at 2023-11-14 22:13:44 UTC (retry backoff)"
    )


def test_a_caller_given_order_replaces_class_fair_share_and_aging_ties_by_arrival() -> None:
    # The simulator's baselines order jobs by a key of their ids (SchedulingPolicy.order_key).
    rank = {"key-a": (2.0,), "key-b": (1.0,), "key-c": (1.0,)}
    policy = SchedulingPolicy(order_key=lambda job_id: rank[job_id], aging_max_wait_s=1.0)
    history = History("1x8:1:1", policy=policy)
    rank[history.occupy("n0000", 8, a_job("key-0").preemptible(False).estimate(60))] = (0.0,)
    history.submit(
        a_job("key-a").gpus(8).priority("production"),
        a_job("key-b").gpus(8).priority("best-effort"),
        a_job("key-c").gpus(8),
    )
    for _ in range(3):
        running = next(v.job_id for v in history.state.jobs() if v.state == "running")
        history.advance(60)
        history.exit(running, 0)
        history.run()

    assert [g.job_id for g in history.events(GangReserved)] == [
        "key-0",
        "key-b",
        "key-c",
        "key-a",
    ]


def test_a_preemptor_whose_victims_are_gone_takes_their_gpus_before_a_higher_class() -> None:
    # The production job paid for the node by evicting the best-effort gang; an
    # inference-critical job that arrived during the eviction does not take the node from it.
    history = History("1x8:1:1")
    victim = history.submit(a_job().gpus(8).priority("best-effort"))[0]
    history.run()
    preemptor = history.submit(a_job().gpus(8).priority("production"))[0]
    history.run()
    assert history.job(victim).state == "preempting"
    critical = history.submit(a_job().gpus(8).priority("inference-critical"))[0]
    history.evict(victim)

    history.run()

    assert history.job(preemptor).state == "running"
    assert history.job(critical).state == "queued"


# The simulator's clock is the trace's time, which starts at zero: a job may be submitted, and
# begin waiting, at 0.0. The keys order such jobs as any others.


def test_a_preemptor_whose_victims_are_gone_goes_before_aged_jobs_whatever_class_and_clock() -> (
    None
):
    # A preemptor of a class ranked 0 against a job aged since the clock's zero, which arrived
    # before it: the tier alone decides, not the rank or the wait.
    aged = gangway_key(_waiting(1, 0.0, 0.0), 300, 0.0, True, False, True)
    preemptor = gangway_key(_waiting(2, 0.0, 0.0), 0, 0.0, False, True, False)

    assert sorted([aged, preemptor]) == [preemptor, aged]


def test_aged_jobs_go_oldest_wait_first_on_a_clock_that_starts_at_zero() -> None:
    # Job 1 began waiting at the clock's zero, job 2 half a second later: job 1 has waited
    # longer, whatever the order of their arrival.
    first = gangway_key(_waiting(2, 0.0, 0.0), 0, 0.0, True, False, False)
    later = gangway_key(_waiting(1, 0.0, 0.5), 0, 0.0, True, False, False)

    assert sorted([later, first]) == [first, later]


def test_jobs_equal_in_all_else_go_oldest_submission_first_on_a_clock_that_starts_at_zero() -> None:
    first = gangway_key(_waiting(1, 0.0, 0.0), 100, 0.0, False, False, True)
    later = gangway_key(_waiting(2, 0.5, 0.5), 100, 0.0, False, False, True)

    assert sorted([later, first]) == [first, later]


def test_jobs_equal_in_all_else_go_by_submission_time_not_by_log_position() -> None:
    # A submission's time is its transaction's: of two made at nearly the same moment, the log
    # may record the earlier one second. The earlier submission goes first; the log position
    # (`seq`) only breaks ties of time.
    recorded_first = gangway_key(_waiting(1, T0 + 0.2, T0 + 0.2), 100, 0.0, False, False, True)
    submitted_first = gangway_key(_waiting(2, T0 + 0.1, T0 + 0.1), 100, 0.0, False, False, True)
    same_time = gangway_key(_waiting(3, T0 + 0.1, T0 + 0.1), 100, 0.0, False, False, True)

    assert sorted([same_time, recorded_first, submitted_first]) == [
        submitted_first,
        same_time,
        recorded_first,
    ]
