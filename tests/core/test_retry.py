"""Retries back off: a crashing gang is not placed again at once, and `why` says until when;
a failure that would repeat (out of memory again at the same size) is not retried at all."""

from __future__ import annotations

from core import SchedulingPolicy
from core.retry import attempt_size, repeated_oom, retry_delay_s
from schemas.jobs import GangReserved, JobDeferred, JobFailed, JobRequeued, TaskExited
from schemas.reasons import AGENT_RESTARTED, FAILURE_REQUEUE_CODES
from tests.core.builders import History, a_job

OOM_EXIT_REASON = "out of memory: killed by the kernel's OOM killer"


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


def test_ranks_lost_with_their_restarted_agent_are_not_the_job_s_failure() -> None:
    """attack12: a kill -9 of the agent (its service restarted by the supervisor) stopped
    every rank on its nodes, and its successor recorded each as exited "agent restarted: rank
    lost": the scheduler counted that as the job's failure, so a job of `max_retries: 0`
    failed for good, others spent a retry and waited out a backoff, during which the capacity
    reclaimed for a guaranteed team's job went back to the borrowers it had been taken from.
    As for a lost node, the gang restarts whole, at once, and no retry is spent."""
    history = History("2x8:2:1", policy=SchedulingPolicy(retry_backoff_base_s=30))
    job = history.submit(a_job().gpus(8).tasks(2).retries(0))[0]
    history.run()
    assert history.job(job).state == "running"
    history.exit(job, -1, ranks=[0], reason=f"{AGENT_RESTARTED}lost")
    history.exit(job, -9, ranks=[1], reason=f"{AGENT_RESTARTED}stopped")
    history.run(cycles=2)
    assert history.events(JobFailed, job) == []
    [requeued] = history.events(JobRequeued, job)
    assert requeued.code not in FAILURE_REQUEUE_CODES
    assert "agent" in requeued.reason, requeued.reason
    assert (history.job(job).state, history.job(job).attempt) == ("running", 2)
    assert history.state.job_records[job].failures == 0
    assert history.auditor.violations == []


def test_a_rank_that_failed_before_its_agent_restarted_is_still_a_failure() -> None:
    history = History("2x8:2:1")
    job = history.submit(a_job().gpus(8).tasks(2).retries(0))[0]
    history.run()
    history.exit(job, 3, ranks=[0])
    history.exit(job, -1, ranks=[1], reason=f"{AGENT_RESTARTED}lost")
    history.cycle()
    [failed] = history.events(JobFailed, job)
    assert "rank 0 exited with code 3" in failed.reason


def test_a_job_whose_agent_restarts_under_it_again_and_again_spends_its_retries() -> None:
    """review13: a rank lost with its restarted agent spent no retry and waited no backoff,
    however often: a job whose launch crashes its agent (or that lands on a node whose agent
    restarts in a loop) was requeued at once, without end, each attempt crashing the agent
    again. A few such losses are free; past them each spends a retry, as a rank's failure."""
    history = History("1x8:1:1", policy=SchedulingPolicy(retry_backoff_base_s=30))
    job = history.submit(a_job().gpus(8).retries(2))[0]
    history.run()
    for _ in range(20):
        if history.job(job).state == "running":
            history.exit(job, -1, reason=f"{AGENT_RESTARTED}lost")
        history.run(cycles=2)
        if history.job(job).state == "queued":
            history.advance(600)  # past a backoff
    [failed] = history.events(JobFailed, job)
    assert "agent restarted" in failed.reason, failed.reason
    assert history.state.job_records[job].failures == 2
    assert history.auditor.violations == []


def test_agent_restarts_far_apart_never_spend_a_retry() -> None:
    """The bound is on losses in a row, each soon after its gang started: a long job that
    lives through many agent restarts (a fleet's upgrades) spends no retry on them."""
    policy = SchedulingPolicy(retry_backoff_base_s=30)
    history = History("1x8:1:1", policy=policy)
    job = history.submit(a_job().gpus(8).retries(0))[0]
    history.run()
    for _ in range(8):
        assert history.job(job).state == "running"
        history.advance(policy.hysteresis_s + 1)
        history.exit(job, -1, reason=f"{AGENT_RESTARTED}lost")
        history.run(cycles=2)
    assert history.events(JobFailed, job) == []
    assert history.state.job_records[job].failures == 0


def ran_out_of_memory(history: History, job_id: str, rank: int = 0) -> None:
    """The job's agent saw the rank die of SIGKILL while its memory cgroup counted an OOM kill."""
    gang = history.gang(job_id)
    placement = gang.ranks[rank]
    history.record(
        TaskExited(
            job_id=job_id,
            attempt=gang.attempt,
            rank=rank,
            node_id=placement.node_id,
            exit_code=137,
            reason=OOM_EXIT_REASON,
            out_of_memory=True,
        )
    )


def test_the_first_out_of_memory_exit_is_retried() -> None:
    history = History(policy=SchedulingPolicy(retry_backoff_base_s=0))
    job = history.submit(a_job().gpus(8).tasks(2).retries(5))[0]
    history.run(cycles=2)
    ran_out_of_memory(history, job)
    history.run(cycles=2)
    [requeued] = history.events(JobRequeued, job)
    assert requeued.code == "task_failed" and OOM_EXIT_REASON in requeued.reason
    assert history.job(job).state == "running" and history.job(job).attempt == 2


def test_out_of_memory_twice_at_the_same_size_fails_the_job_at_once_with_the_reason() -> None:
    history = History(policy=SchedulingPolicy(retry_backoff_base_s=0))
    job = history.submit(a_job().gpus(8).tasks(2).retries(5))[0]
    history.run(cycles=2)
    ran_out_of_memory(history, job, rank=1)
    history.run(cycles=2)
    ran_out_of_memory(history, job, rank=0)
    history.run(cycles=2)
    [failed] = history.events(JobFailed, job)
    assert history.job(job).state == "failed"
    assert len(history.events(JobRequeued, job)) == 1  # retries were left: not used
    assert "ran out of memory again at the same size (2 ranks of gpus_per_task=8)" in failed.reason
    assert "attempts 1 and 2" in failed.reason and "give each task more memory" in failed.reason
    # A restarted scheduler folding the same log decides the same.
    assert history.replayed().job(job) == history.job(job)


def test_a_crash_between_two_out_of_memory_exits_does_not_hide_the_repeat() -> None:
    history = History(policy=SchedulingPolicy(retry_backoff_base_s=0))
    job = history.submit(a_job().gpus(4).retries(5))[0]
    history.run(cycles=2)
    ran_out_of_memory(history, job)
    history.run(cycles=2)
    history.exit(job, 1)  # an ordinary crash: counts as a failure, not as memory
    history.run(cycles=2)
    assert history.job(job).state == "running"
    ran_out_of_memory(history, job)
    history.run(cycles=2)
    [failed] = history.events(JobFailed, job)
    assert "attempts 1 and 3" in failed.reason


def test_an_out_of_memory_exit_at_another_size_is_retried() -> None:
    """An elastic gang placed with fewer ranks is another size: each rank holds another share."""
    history = History("2x8:2:1", SchedulingPolicy(retry_backoff_base_s=0))
    job = history.submit(a_job().gpus(8).tasks(2).min_tasks(1).retries(5))[0]
    history.run(cycles=2)
    assert len(history.gang(job).ranks) == 2
    ran_out_of_memory(history, job)
    history.lose("n0001")
    history.run(cycles=2)
    assert len(history.gang(job).ranks) == 1
    ran_out_of_memory(history, job)
    history.run(cycles=2)
    assert history.events(JobFailed, job) == []
    assert history.job(job).state == "running"


def test_the_size_names_what_each_task_was_given() -> None:
    spec = a_job().gpus(8).tasks(4).gpu_type("h100").spec()
    assert attempt_size(spec, 4) == "4 ranks of gpu_type=h100, gpus_per_task=8"
    assert repeated_oom("1 rank of gpus_per_task=1", {3}) is None
    assert repeated_oom("1 rank of gpus_per_task=1", {1, 4}) is not None
