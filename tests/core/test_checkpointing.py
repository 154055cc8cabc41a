"""`checkpoint: {interval_s: auto}` (core/checkpointing.py): the Young-Daly interval from the
job's measured checkpoint cost and the failure rate seen on its kind of node, chosen when a
gang starts and recorded in its GangReserved; a replay chooses the same."""

from __future__ import annotations

import math

import pytest

from core.checkpointing import (
    HOUR_S,
    PRIOR_CHECKPOINT_COST_S,
    PRIOR_NODE_MTBF_H,
    CheckpointKnowledge,
    young_daly_interval,
)
from schemas.checkpoints import CheckpointCommitted, CheckpointRequested, CheckpointShard
from schemas.jobs import GangReserved
from tests.core.builders import History, JobBuilder, a_job

SHARD = CheckpointShard(rank=0, uri="file:///ck/0", bytes=1, sha256="0" * 64)


def auto_job(name: str = "train", tasks: int = 1) -> JobBuilder:
    return a_job().named(name).gpus(8).tasks(tasks).checkpoint_every("auto")


def checkpoint(history: History, job_id: str, takes_s: float) -> None:
    """A periodic checkpoint of the job's current attempt, committed `takes_s` later."""
    attempt = history.gang(job_id).attempt
    history.record(CheckpointRequested(job_id=job_id, attempt=attempt, reason="periodic"))
    history.advance(takes_s)
    history.record(
        CheckpointCommitted(
            job_id=job_id, attempt=attempt, checkpoint_id=f"c{history.now}", step=1, shards=[SHARD]
        )
    )


def test_young_daly_is_the_square_root_of_twice_the_cost_over_the_failure_rate() -> None:
    mtbf_s = 1000 * HOUR_S
    assert young_daly_interval(30.0, 1 / mtbf_s) == pytest.approx(math.sqrt(2 * 30.0 * mtbf_s))
    assert young_daly_interval(30.0, 0.0) == math.inf


def test_a_first_gang_with_nothing_measured_gets_the_priors_interval() -> None:
    history = History("1x8")
    job = history.submit(auto_job())[0]

    history.run()

    expected = young_daly_interval(PRIOR_CHECKPOINT_COST_S, 1 / (PRIOR_NODE_MTBF_H * HOUR_S))
    assert history.gang(job).checkpoint_interval_s == pytest.approx(expected, abs=0.1)


def test_a_fixed_interval_is_recorded_as_given_and_none_without_one() -> None:
    history = History("2x8:2:1")
    fixed = history.submit(a_job().gpus(8).checkpoint_every(1800))[0]
    plain = history.submit(a_job().gpus(8))[0]

    history.run()

    assert history.gang(fixed).checkpoint_interval_s == 1800
    assert history.gang(plain).checkpoint_interval_s is None


def test_the_interval_follows_the_jobs_measured_checkpoint_cost() -> None:
    """Checkpoints that take four times as long double the interval (sqrt)."""
    cheap, dear = History("1x8"), History("1x8")
    for history, cost in ((cheap, 30.0), (dear, 120.0)):
        job = history.submit(auto_job())[0]
        history.run()
        checkpoint(history, job, cost)
        history.lose("n0000")
        history.recover("n0000")
        history.run(cycles=3)

    first, second = (h.events(GangReserved)[-1].checkpoint_interval_s for h in (cheap, dear))
    assert first is not None and second is not None
    assert second / first == pytest.approx(2.0, rel=0.01)


def test_nodes_that_fail_more_often_get_shorter_intervals() -> None:
    """Four node failures in a day on 8 nodes of the kind: the rate is the failures over the
    node-hours seen (with the prior's one failure in 1,000 node-hours added)."""
    history = History("8x8:8:1")
    for _ in range(4):
        history.advance(6 * HOUR_S)
        history.lose("n0003")
        history.recover("n0003")
    job = history.submit(auto_job())[0]

    history.run()

    rate = history.state.checkpoints.node_failure_rate("H100", history.now)
    interval = history.gang(job).checkpoint_interval_s
    assert interval is not None
    assert rate > 1 / (PRIOR_NODE_MTBF_H * HOUR_S)
    assert interval == pytest.approx(young_daly_interval(PRIOR_CHECKPOINT_COST_S, rate), abs=0.1)
    quiet = young_daly_interval(PRIOR_CHECKPOINT_COST_S, 1 / (PRIOR_NODE_MTBF_H * HOUR_S))
    assert interval < quiet / 2


def test_a_gang_on_more_nodes_fails_more_often_and_checkpoints_more_often() -> None:
    history = History("4x8:4:1")
    small = history.submit(auto_job("small"))[0]
    big = history.submit(auto_job("big", tasks=2))[0]

    history.run()

    one, two = history.gang(small).checkpoint_interval_s, history.gang(big).checkpoint_interval_s
    assert one is not None and two is not None
    assert one / two == pytest.approx(math.sqrt(2), rel=0.01)


def test_a_replay_chooses_the_same_interval() -> None:
    history = History("2x8:2:1")
    job = history.submit(auto_job())[0]
    history.run()
    checkpoint(history, job, 45.0)
    history.advance(HOUR_S)
    history.lose("n0001")

    replayed = history.replayed()

    live, again = history.state.checkpoints, replayed.checkpoints
    assert live.checkpoint_cost_s(job) == again.checkpoint_cost_s(job) == 45.0
    assert live.auto_interval_s(job, "H100", 1, history.now) == again.auto_interval_s(
        job, "H100", 1, history.now
    )


def test_knowledge_starts_from_the_priors() -> None:
    knowledge = CheckpointKnowledge()
    assert knowledge.checkpoint_cost_s("any") == PRIOR_CHECKPOINT_COST_S
    assert knowledge.node_failure_rate("H100", 0.0) == 1 / (PRIOR_NODE_MTBF_H * HOUR_S)
