"""Retries back off: a crashing gang is not placed again at once, and `why` says until when."""

from __future__ import annotations

from core import SchedulingPolicy
from core.retry import retry_delay_s
from schemas.jobs import GangReserved, JobDeferred, JobFailed, JobRequeued
from tests.core.builders import History, a_job


def test_the_wait_doubles_with_each_failure_up_to_the_cap_with_jitter() -> None:
    policy = SchedulingPolicy(retry_backoff_base_s=10, retry_backoff_cap_s=60)
    delays = [retry_delay_s("job-1", failures, policy) for failures in range(1, 7)]
    ceilings = [10, 20, 40, 60, 60, 60]
    assert all(c / 2 <= d < c for d, c in zip(delays, ceilings, strict=True))
    assert delays == [retry_delay_s("job-1", f, policy) for f in range(1, 7)]  # deterministic
    assert retry_delay_s("job-1", 1, policy) != retry_delay_s("job-2", 1, policy)


def test_a_failed_gang_waits_out_its_backoff_before_its_next_attempt() -> None:
    history = History(policy=SchedulingPolicy(retry_backoff_base_s=30, retry_backoff_cap_s=600))
    job = history.submit(a_job().gpus(8).retries(3))[0]
    history.run()
    history.exit(job, 1)
    history.cycle()
    assert len(history.events(JobRequeued, job)) == 1
    retry_at = history.state.job_records[job].retry_at
    assert retry_at is not None and history.now + 15 <= retry_at < history.now + 30

    history.run(cycles=3, every_s=1)
    assert len(history.events(GangReserved, job)) == 1
    [deferred] = history.deferrals(job)[-1:]
    assert isinstance(deferred, JobDeferred) and deferred.code == "retry_backoff"
    assert "the next attempt may start at" in deferred.message
    assert history.cycles[-1].next_wakeup == retry_at

    history.now = retry_at
    history.run()
    assert len(history.events(GangReserved, job)) == 2
    assert history.job(job).state == "running"


def test_a_hardware_requeue_is_not_held_back() -> None:
    history = History("2x8:2:1")
    job = history.submit(a_job().gpus(8))[0]
    history.run()
    history.lose(next(iter(history.job(job).placement)))
    history.run(cycles=2)
    assert history.job(job).state == "running"
    assert history.events(JobFailed, job) == []
