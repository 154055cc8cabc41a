"""The core decides outcomes: success, retries, cancel, suspend/resume, runtime limits, hardware."""

from __future__ import annotations

from datetime import UTC, datetime

from core import schedule
from schemas.jobs import (
    GangReserved,
    JobAdmitted,
    JobCancelled,
    JobFailed,
    JobRejected,
    JobRequeued,
    JobResumed,
    JobSpec,
    JobSubmitted,
    JobSucceeded,
    JobSuspended,
    PreemptionRequested,
    TaskExited,
    TaskStarted,
)
from schemas.nodes import NodeDrained, NodeDrainRequested, NodeUndrained
from tests.core.builders import History, a_job


def test_all_ranks_exiting_zero_succeeds_the_job_and_frees_its_gpus() -> None:
    history = History()
    job = history.submit(a_job().gpus(8).tasks(2))[0]
    history.run()

    history.exit(job, 0)
    history.run()

    assert history.job(job).state == "succeeded"
    assert history.state.allocated_gpus == 0
    assert len(history.events(JobSucceeded, job)) == 1


def test_a_failed_rank_requeues_the_whole_gang_while_retries_remain() -> None:
    history = History()
    job = history.submit(a_job().gpus(8).tasks(2).retries(1))[0]
    history.run()

    history.exit(job, 1, ranks=[1])
    history.cycle()

    requeue = history.events(JobRequeued, job)
    assert [e.code for e in requeue] == ["task_failed"]
    history.advance(history.policy.retry_backoff_base_s)  # the first backoff is at most this
    history.run()
    assert history.job(job).state == "running"
    assert history.job(job).attempt == 2


def test_a_failed_rank_fails_the_job_once_retries_are_spent() -> None:
    history = History()
    job = history.submit(a_job().gpus(8).retries(0))[0]
    history.run()

    history.exit(job, 137)
    history.run()

    assert history.job(job).state == "failed"
    assert history.state.allocated_gpus == 0


def test_cancelling_a_running_job_releases_it_without_preemption() -> None:
    history = History()
    job = history.submit(a_job().gpus(8))[0]
    history.run()

    history.cancel(job)
    history.run()

    assert history.job(job).state == "cancelled"
    assert history.events(PreemptionRequested, job) == []
    assert len(history.events(JobCancelled, job)) == 1
    assert history.state.allocated_gpus == 0


def test_cancelling_a_waiting_job_ends_it() -> None:
    history = History("1x8:1:1")
    history.submit(a_job().gpus(8))
    waiting = history.submit(a_job().gpus(8))[0]
    history.run()

    history.cancel(waiting)
    history.run()

    assert history.job(waiting).state == "cancelled"


def test_suspend_releases_the_gang_and_resume_queues_it_again() -> None:
    history = History()
    job = history.submit(a_job().gpus(8))[0]
    history.run()

    history.suspend(job)
    history.run()
    history.evict(job)  # checkpointed, then stopped
    history.run()
    assert history.job(job).state == "suspended"
    assert history.state.allocated_gpus == 0

    history.resume(job)
    history.run(cycles=2)
    assert history.job(job).state == "running"


def test_a_job_past_its_max_runtime_is_checkpointed_then_fails() -> None:
    history = History()
    job = history.submit(a_job().gpus(8).max_runtime(600))[0]
    history.run()

    history.advance(601)
    history.run()
    [stop] = history.events(PreemptionRequested, job)
    assert stop.preemptor_job_id is None and "max_runtime_s (600 s)" in stop.reason
    assert history.job(job).state == "preempting"

    history.evict(job)  # the agents checkpoint the ranks, then stop them
    history.run()
    assert history.job(job).state == "failed"
    assert history.events(JobFailed, job)[0].reason == (
        "exceeded max_runtime_s (600 s); stopped after its checkpoint"
    )
    assert history.events(JobRequeued, job) == []


def test_a_job_past_its_estimate_runs_on() -> None:
    history = History()
    job = history.submit(a_job().gpus(8).estimate(60))[0]
    history.run()
    history.submit(a_job().gpus(8).tasks(16).priority("research"))
    history.advance(100_000)
    history.run(cycles=5, every_s=600)
    assert history.job(job).state == "running"
    assert history.events(PreemptionRequested, job) == []


def test_a_lost_node_requeues_every_gang_on_it_whole() -> None:
    history = History("8x8:4:2")
    job = history.submit(a_job().gpus(8).tasks(3))[0]
    history.run()
    node = sorted(history.job(job).placement)[1]

    history.lose(node)
    history.cycle()

    assert [e.code for e in history.events(JobRequeued, job)] == ["node_lost"]
    assert history.job(job).placement == {}
    history.run()
    assert node not in history.job(job).placement
    assert history.job(job).state == "running"


def test_an_unhealthy_gpu_requeues_the_gang_that_holds_it() -> None:
    history = History("2x8:2:1")
    job = history.submit(a_job().gpus(8))[0]
    history.run()
    node = next(iter(history.job(job).placement))

    history.break_gpu(node, 5)
    history.cycle()

    assert [e.code for e in history.events(JobRequeued, job)] == ["gpu_unhealthy"]


def test_draining_a_node_checkpoints_its_gangs_away_then_reports_it_drained() -> None:
    history = History("4x8:4:1")
    job = history.submit(a_job().gpus(8).tasks(2))[0]
    history.run()
    node = sorted(history.job(job).placement)[0]

    history.drain(node)
    history.cycle()
    assert len(history.events(PreemptionRequested, job)) == 1
    assert history.events(NodeDrained) == []

    history.evict(job)  # ranks checkpoint and stop
    history.cycle()

    assert [e.code for e in history.events(JobRequeued, job)] == ["node_drained"]
    # No checkpoint was committed here: the reason claims none.
    assert [e.reason for e in history.events(JobRequeued, job)] == ["moved off a draining node"]
    assert [e.node_id for e in history.events(NodeDrained)] == [node]
    history.run()
    assert node not in history.job(job).placement


def test_preempted_gangs_are_requeued_at_the_grace_deadline_if_ranks_do_not_exit() -> None:
    history = History("2x8:2:1")
    job = history.submit(a_job().gpus(8))[0]
    history.run()
    history.drain(next(iter(history.job(job).placement)))
    history.cycle()

    history.advance(history.policy.preemption_grace_s - 1)
    history.cycle()
    assert history.events(JobRequeued, job) == []

    history.advance(2)
    history.cycle()
    assert len(history.events(JobRequeued, job)) == 1


def test_draining_an_empty_node_reports_it_drained_at_once() -> None:
    history = History("2x8:2:1")

    history.drain("n0001")
    history.cycle()

    assert [e.node_id for e in history.events(NodeDrained)] == ["n0001"]
    assert history.state.node("n0001").state == "drained"  # type: ignore[union-attr]


def test_a_rank_that_can_never_launch_fails_the_job_at_once_with_the_agents_reason() -> None:
    history = History()
    job = history.submit(a_job().gpus(8).retries(3))[0]
    history.cycle()
    gang = history.gang(job)
    rank = gang.ranks[0]
    history.record(TaskStarted(job_id=job, attempt=1, rank=0, node_id=rank.node_id))
    history.record(
        TaskExited(
            job_id=job,
            attempt=1,
            rank=0,
            node_id=rank.node_id,
            exit_code=127,
            reason=f"launch failed on {rank.node_id} rank 0: "
            "illegal environment variable name 'A=B'",
            permanent=True,
        )
    )
    history.cycle()

    assert history.events(JobRequeued, job) == []
    [failed] = history.events(JobFailed, job)
    assert "illegal environment variable name 'A=B'" in failed.reason
    assert history.job(job).state == "failed"
    assert history.state.allocated_gpus == 0


def test_a_rank_killed_for_its_disk_fails_the_job_at_once_with_the_reason() -> None:
    """The agent kills a rank past its disk limit (services/agent/disk.py) and says so as
    permanent: a retry would fill the disk again, so the job fails, retries left or not."""
    history = History()
    job = history.submit(a_job().gpus(8).tasks(2).retries(3))[0]
    history.cycle()
    for rank in history.gang(job).ranks:
        history.record(TaskStarted(job_id=job, attempt=1, rank=rank.rank, node_id=rank.node_id))
    history.cycle()
    node = history.gang(job).ranks[1].node_id
    reason = "disk limit exceeded: its working directory held more than its 20 MB"
    history.record(
        TaskExited(
            job_id=job,
            attempt=1,
            rank=1,
            node_id=node,
            exit_code=-9,
            reason=reason,
            permanent=True,
        )
    )
    history.cycle()

    assert history.events(JobRequeued, job) == []
    [failed] = history.events(JobFailed, job)
    assert reason in failed.reason
    assert history.job(job).state == "failed"


def test_a_transient_launch_failure_is_retried_with_its_reason() -> None:
    history = History()
    job = history.submit(a_job().gpus(8).retries(2))[0]
    history.cycle()
    node = history.gang(job).ranks[0].node_id
    history.record(TaskStarted(job_id=job, attempt=1, rank=0, node_id=node))
    history.record(
        TaskExited(
            job_id=job,
            attempt=1,
            rank=0,
            node_id=node,
            exit_code=127,
            reason=f"launch failed on {node} rank 0: Resource temporarily unavailable",
        )
    )
    history.cycle()

    [requeued] = history.events(JobRequeued, job)
    assert requeued.reason.startswith(f"launch failed on {node} rank 0")


def test_an_operator_drain_with_a_deadline_lets_the_gang_run_until_then() -> None:
    history = History("4x8:4:1")
    job = history.submit(a_job().gpus(8))[0]
    history.run()
    node = next(iter(history.job(job).placement))
    deadline = history.now + 3600
    history.record(
        NodeDrainRequested(
            node_id=node,
            reason="maintenance",
            by="admin",
            deadline=datetime.fromtimestamp(deadline, UTC),
        )
    )
    result = schedule(history.state, history.now)
    assert result.decisions == [] and result.next_wakeup == deadline
    history.advance(3601)
    history.cycle()
    assert len(history.events(PreemptionRequested, job)) == 1


def test_an_undrained_node_takes_work_again() -> None:
    history = History("1x8")
    history.drain("n0000")
    history.cycle()
    history.record(NodeUndrained(node_id="n0000", by="admin"))
    job = history.submit(a_job().gpus(8))[0]
    history.run()
    assert history.job(job).state == "running"


def test_suspend_checkpoints_the_running_gang_before_stopping_it() -> None:
    history = History()
    job = history.submit(a_job().gpus(8).tasks(2))[0]
    history.run()

    history.suspend(job)
    history.cycle()
    [request] = history.events(PreemptionRequested, job)
    assert request.preemptor_job_id is None and "checkpoint" in request.reason
    assert history.job(job).state == "preempting"
    assert history.events(JobSuspended, job) == []

    history.evict(job)  # the agents write the shards, then stop the ranks
    history.cycle()
    assert [e.attempt for e in history.events(JobSuspended, job)] == [1]
    assert history.job(job).state == "suspended"
    assert history.events(JobRequeued, job) == []
    assert history.state.allocated_gpus == 0


def test_a_gang_whose_ranks_never_start_is_released_at_the_launch_timeout() -> None:
    history = History("2x8:2:1")
    job = history.submit(a_job().gpus(8).tasks(2).retries(1))[0]
    history.cycle()
    gang = history.gang(job)
    history.record(
        TaskStarted(job_id=job, attempt=1, rank=0, node_id=gang.ranks[0].node_id)
    )  # rank 1's agent never reports
    history.advance(history.policy.launch_timeout_s - 1)
    assert schedule(history.state, history.now).decisions == []

    history.advance(2)
    history.cycle()
    [requeued] = history.events(JobRequeued, job)
    assert requeued.code == "launch_timeout"
    assert requeued.reason.startswith(f"rank 1 on {gang.ranks[1].node_id} did not start within")
    assert history.state.allocated_gpus == 0
    history.exit(job, 143, ranks=[0], reason="requeued")  # the agent stops the started rank

    history.advance(history.policy.retry_backoff_cap_s)
    history.cycle()  # the second attempt never starts either: no retries left
    assert len(history.events(GangReserved, job)) == 2
    second = history.gang(job)
    history.record(TaskStarted(job_id=job, attempt=2, rank=0, node_id=second.ranks[0].node_id))
    history.advance(history.policy.launch_timeout_s + 1)
    history.cycle()
    [failed] = history.events(JobFailed, job)
    assert "did not start within" in failed.reason and "no retries left" in failed.reason


def test_a_launch_timeout_while_no_rank_starts_anywhere_spends_no_retry() -> None:
    """Found in an operator's run (the broker stopped for five minutes): the agents could not
    hear the gangs reserved meanwhile, each timed out as if its own launch had failed, and a
    job with no retry left failed. With no rank of any gang started since the reservation,
    the launch path is down, not the job's launch: released, requeued, no retry spent."""
    history = History("2x8:2:1")
    job = history.submit(a_job().gpus(8).retries(0))[0]
    history.cycle()
    history.advance(history.policy.launch_timeout_s + 1)
    history.cycle()
    assert history.events(JobFailed, job) == []
    [requeued] = history.events(JobRequeued, job)
    assert requeued.code == "launch_unheard"
    assert "did not start within" in requeued.reason
    assert "not counted as a failure" in requeued.reason
    assert history.state.allocated_gpus == 0
    record = history.state.job_records[job]
    assert (record.state, record.failures) == ("queued", 0)

    history.cycle()  # placed again at once (no backoff), and started once the bus is back
    assert len(history.events(GangReserved, job)) == 2
    history.start(job)
    assert history.job(job).state == "running"


def test_a_launch_timeout_is_the_jobs_once_another_gang_started_since() -> None:
    history = History("2x8:2:1")
    stuck = history.submit(a_job().gpus(8).retries(0))[0]
    history.cycle()
    history.advance(1)
    other = history.submit(a_job().gpus(8))[0]
    history.cycle()
    history.start(other)  # its agent heard its reservation: the launch path works
    history.advance(history.policy.launch_timeout_s)
    history.cycle()
    [failed] = history.events(JobFailed, stuck)
    assert "did not start within" in failed.reason and "no retries left" in failed.reason


def test_a_gpu_goes_to_a_new_gang_only_after_the_old_ranks_exited() -> None:
    history = History("1x8")
    old = history.submit(a_job().gpus(8))[0]
    history.run()
    history.cancel(old)
    waiting = history.submit(a_job().gpus(8))[0]
    for _ in range(3):  # its agent has not stopped the rank yet
        history.cycle()
        history.advance(1)
    # Cancelled in the log, but its rank still runs (it may take its stop timeout to die).
    assert history.job(old).state == "cancelled"
    assert history.events(GangReserved, waiting) == []

    history.exit(old, -15, reason="cancelled")
    history.run()
    assert history.job(waiting).state == "running"
    assert history.auditor.violations == []


def test_the_gpus_of_a_lost_node_are_not_waited_for() -> None:
    history = History("1x8")
    job = history.submit(a_job().gpus(8))[0]
    history.run()
    history.lose("n0000")
    history.run()
    history.recover("n0000")
    history.run(cycles=2)
    # Nothing of the first attempt survived the loss: the second one gets the same GPUs.
    assert (history.job(job).state, history.job(job).attempt) == ("running", 2)


def test_a_rank_reported_started_after_its_gang_was_released_still_holds_its_gpus() -> None:
    history = History("1x8")
    old = history.submit(a_job().gpus(8))[0]
    history.cycle()  # reserved; its agent is still launching the rank
    history.cancel(old)
    history.cycle()
    history.start(old)  # the launch raced the release: the rank runs
    waiting = history.submit(a_job().gpus(8))[0]
    history.cycle()
    assert history.events(GangReserved, waiting) == []

    history.exit(old, -15, reason="cancelled")
    history.cycle()
    assert len(history.events(GangReserved, waiting)) == 1
    assert history.auditor.violations == []


def test_gangs_a_drain_moves_in_this_cycle_do_not_make_their_team_a_borrower() -> None:
    """Found by the lifecycle model: alpha runs 10 GPUs against a guarantee of 8, six of them
    on a node that starts draining. Once those leave, alpha holds 4, within its guarantee, so
    beta's waiting job must not take alpha's other gang in the cycle that moves them."""
    history = History("2x8:2:1")
    history.team("alpha", guaranteed=8).team("beta", guaranteed=4)
    moved = [
        history.occupy("n0000", 2, a_job().team("alpha").priority("inference-critical"))
        for _ in range(3)
    ]
    kept = history.occupy("n0001", 4, a_job().team("alpha").priority("production"))
    waiting = history.submit(a_job().gpus(4).tasks(2).team("beta").priority("inference-critical"))[
        0
    ]
    history.record(NodeDrainRequested(node_id="n0000", reason="maintenance", by="admin"))
    history.cycle()
    asked = {e.job_id: e.preemptor_job_id for e in history.events(PreemptionRequested)}
    assert asked == dict.fromkeys(moved)  # the drain moves them; nobody preempts `kept`
    assert history.job(kept).state == "running"
    assert history.job(waiting).state == "queued"
    assert history.auditor.violations == []


def test_a_node_lost_and_back_before_the_next_cycle_still_restarts_its_gangs_whole() -> None:
    history = History("2x8:2:1")
    job = history.submit(a_job().gpus(8))[0]
    history.run()
    [node] = history.job(job).placement
    history.lose(node)
    history.recover(node)  # back before any cycle ran: its ranks died with it all the same
    history.run(cycles=2)
    [requeued] = history.events(JobRequeued, job)
    assert requeued.code == "node_lost"
    assert history.job(job).state == "running" and history.job(job).attempt == 2


def test_ranks_lost_with_their_node_hold_no_gpus_once_their_gang_is_released() -> None:
    """Cancelled after its node was lost and came back: the ranks are gone with the node, so
    its GPUs are free at once (no TaskExited will ever come for them)."""
    history = History("1x8")
    job = history.submit(a_job().gpus(8))[0]
    history.run()
    history.lose("n0000")
    history.recover("n0000")
    history.cancel(job)
    history.cycle()
    assert history.state.node("n0000").free_gpus == 8  # type: ignore[union-attr]
    waiting = history.submit(a_job().gpus(8))[0]
    history.run()
    assert history.job(waiting).state == "running"


def _suspended_before_admission(history: History) -> tuple[str, JobSpec]:
    """A job submitted and suspended while admission was away (an outage): not yet admitted."""
    builder = a_job().gpus(8)
    spec = builder.spec()
    history.record(JobSubmitted(job_id=builder.job_id, spec=spec, submitted_by="test"))
    history.suspend(builder.job_id)
    history.run()
    return builder.job_id, spec


def test_a_job_admitted_while_suspended_before_admission_runs_once_resumed() -> None:
    # attack5's storm: after a Kafka restart admission caught up late and admitted a job the
    # scheduler had already suspended (asked before admission decided); resumed, it waited
    # "awaiting admission" for ever, and the auditor called it unexplained meanwhile.
    history = History()
    job, spec = _suspended_before_admission(history)
    assert history.job(job).state == "suspended"

    history.record(JobAdmitted(job_id=job, queue=spec.team, priority=spec.priority))
    assert history.job(job).state == "suspended"
    assert history.auditor.unexplained() == []

    history.resume(job)
    history.run(cycles=2)
    assert history.job(job).state == "running"
    replayed = history.replayed().job(job)
    assert replayed is not None and replayed.state == "running"


def test_a_job_rejected_while_suspended_before_admission_ends_rejected() -> None:
    history = History()
    job, _ = _suspended_before_admission(history)

    history.record(JobRejected(job_id=job, code="over_quota_max", reason="over the team max"))
    assert history.job(job).state == "rejected"
    history.resume(job)
    history.run()
    assert history.job(job).state == "rejected"
    assert history.events(JobResumed, job) == []


def test_a_job_resumed_before_admission_waits_for_admission_not_for_a_reason() -> None:
    # Suspended and resumed while admission was away (an outage): like any job not yet
    # admitted, it owes no scheduling reason until admission decides.
    history = History()
    job, spec = _suspended_before_admission(history)
    history.resume(job)
    history.run()
    assert history.job(job).state == "pending"
    assert history.auditor.unexplained() == []

    history.record(JobAdmitted(job_id=job, queue=spec.team, priority=spec.priority))
    history.run()
    assert history.job(job).state == "running"
    assert history.auditor.violations == []
