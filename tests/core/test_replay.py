"""Folding is deterministic and tolerant: a replay rebuilds the state; strays change nothing."""

from __future__ import annotations

import pickle

from core import schedule
from schemas.jobs import (
    GangReserved,
    JobCancelled,
    JobRequeued,
    RankPlacement,
    TaskExited,
    TaskStarted,
)
from schemas.nodes import GpuUnhealthy, NodeDrained, NodeLost
from schemas.teams import QueueConfigured
from tests.core.builders import History, a_job


def test_a_replay_of_the_log_rebuilds_the_same_jobs_nodes_and_counters() -> None:
    history = History("4x8:2:2")
    history.team("alpha", guaranteed=8)
    jobs = history.submit(*(a_job().gpus(4).tasks(2).team("alpha") for _ in range(5)))
    history.run(cycles=2)
    history.exit(jobs[0], 0)
    history.lose("n0003")
    history.run(cycles=2)

    replayed = history.replayed()

    assert list(replayed.jobs()) == list(history.state.jobs())
    assert list(replayed.nodes()) == list(history.state.nodes())
    assert replayed.allocated_gpus == history.state.allocated_gpus
    assert replayed.pending == history.state.pending


def test_events_about_unknown_jobs_and_nodes_change_nothing() -> None:
    history = History("2x8:2:1")
    history.submit(a_job().gpus(8))
    history.run()
    before = (list(history.state.jobs()), list(history.state.nodes()))

    for stray in [
        TaskStarted(job_id="ghost", attempt=1, rank=0, node_id="n0000"),
        TaskExited(job_id="ghost", attempt=1, rank=0, node_id="n0000", exit_code=1),
        JobRequeued(job_id="ghost", attempt=1, code="preempted", reason="r"),
        JobCancelled(job_id="ghost", reason="r"),
        GangReserved(
            job_id="ghost", attempt=1, ranks=[RankPlacement(rank=0, node_id="n0001", gpus=[0])]
        ),
        NodeLost(node_id="nowhere", reason="r"),
        GpuUnhealthy(node_id="nowhere", gpu_index=0, reason="r"),
        NodeDrained(node_id="nowhere"),
        QueueConfigured(name="unused", guaranteed_gpus=0),
    ]:
        history.record(stray)

    assert list(history.state.jobs()) == before[0]
    assert list(history.state.nodes()) == before[1]


def test_late_reports_of_an_old_attempt_are_ignored() -> None:
    history = History("2x8:2:1")
    job = history.submit(a_job().gpus(8).retries(2))[0]
    history.run()
    old = history.gang(job)
    history.exit(job, 1)
    history.run(cycles=2, every_s=history.policy.retry_backoff_base_s)  # past the backoff
    assert history.job(job).attempt == 2

    history.record(
        TaskExited(
            job_id=job, attempt=old.attempt, rank=0, node_id=old.ranks[0].node_id, exit_code=1
        )
    )
    history.run()

    assert history.job(job).state == "running"
    assert history.job(job).attempt == 2


def test_a_gang_on_an_unknown_node_is_ignored_whole() -> None:
    history = History("2x8:2:1")
    job = history.submit(a_job().gpus(8).tasks(2))[0]

    history.record(
        GangReserved(
            job_id=job,
            attempt=1,
            ranks=[
                RankPlacement(rank=0, node_id="n0000", gpus=list(range(8))),
                RankPlacement(rank=1, node_id="elsewhere", gpus=list(range(8))),
            ],
        )
    )

    assert history.state.allocated_gpus == 0
    assert history.job(job).placement == {}


def test_a_pickled_state_decides_exactly_as_the_live_one() -> None:
    # The scheduler service snapshots the folded state with pickle to speed up its restarts.
    history = History("4x8:2:2")
    history.team("alpha", guaranteed=8)
    history.submit(*(a_job().gpus(4).tasks(2).team("alpha") for _ in range(6)))
    history.run(cycles=2)
    history.submit(a_job().gpus(8).tasks(3))

    thawed = pickle.loads(pickle.dumps(history.state))

    assert list(thawed.jobs()) == list(history.state.jobs())
    assert schedule(thawed, history.now).decisions == schedule(history.state, history.now).decisions


def test_the_placement_index_kept_between_cycles_decides_as_a_fresh_one() -> None:
    # Half of node 9 comes free, then half of node 1, in separate cycles: in the kept index's
    # set of half-free nodes 9 then collides ahead of 1, while a fresh index inserts 1 first.
    # The choice between equally good nodes must depend on what is free, not on that history.
    history = History("16x8:4:2")
    jobs = history.submit(*(a_job().gpus(4) for _ in range(32)))
    history.run()
    holder = {node: job_id for job_id in jobs for node in history.job(job_id).placement}
    for index in (9, 1):
        history.exit(holder[history.state._node_list[index].node_id], 0)
        history.run(cycles=2)
    history.submit(a_job().gpus(4))

    fresh = history.replayed()

    kept = schedule(history.state, history.now).decisions
    assert kept == schedule(fresh, history.now).decisions
    [reserved] = [d for d in kept if isinstance(d, GangReserved)]
    assert [r.node_id for r in reserved.ranks] == [history.state._node_list[1].node_id]
