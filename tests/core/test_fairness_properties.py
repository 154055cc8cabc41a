"""Properties with preemption for fairness switched on: after every cycle the invariants of
DESIGN §4 and the promises of §3 the auditor checks hold, the same input gives the same
decisions, and a replayed state holds the same attained service.

Thresholds and minimums are small so that the property scenarios (minutes of simulated time)
do climb levels and evict for fairness.
"""

from __future__ import annotations

from functools import partial
from unittest.mock import patch

from hypothesis import given
from hypothesis import strategies as st

import core.cycle
from core import SchedulingPolicy
from core.context import CycleContext, Outcome
from core.fairness import preempt_for_fairness as fair
from core.placement import Snapshot
from core.quota import QuotaBook
from schemas.base import Event
from schemas.jobs import PreemptionRequested
from tests.core.builders import History, a_job
from tests.core.test_properties import Tree, _examples, clusters, operations, play, trees

fair_policies = st.sampled_from(
    [
        SchedulingPolicy(
            fairness_preemption=True,
            las_thresholds_gpu_s=(600.0, 6000.0),
            fairness_min_runtime_s=60.0,
            checkpoint_write_estimate_s=10.0,
        ),
        SchedulingPolicy(
            fairness_preemption=True,
            las_thresholds_gpu_s=(100.0,),
            fairness_min_runtime_s=0.0,
            fairness_gain_factor=0.0,
            hysteresis_s=60.0,
            aging_max_wait_s=1800.0,
        ),
    ]
)


@given(cluster=clusters, policy=fair_policies, tree=trees, ops=operations)
def test_invariants_hold_with_fairness_preemption_on(
    cluster: str, policy: SchedulingPolicy, tree: Tree, ops: list[object]
) -> None:
    play(cluster, policy, tree, ops)


@_examples(0.25)
@given(cluster=clusters, policy=fair_policies, tree=trees, ops=operations)
def test_the_same_input_gives_the_same_fairness_decisions(
    cluster: str, policy: SchedulingPolicy, tree: Tree, ops: list[object]
) -> None:
    first = play(cluster, policy, tree, ops)
    second = play(cluster, policy, tree, ops)

    def decisions(history: History) -> list[Event]:
        return [d for cycle in history.cycles for d in cycle.decisions]

    assert decisions(first) == decisions(second)


@_examples(0.25)
@given(cluster=clusters, policy=fair_policies, tree=trees, ops=operations)
def test_a_replayed_state_holds_the_same_attained_service(
    cluster: str, policy: SchedulingPolicy, tree: Tree, ops: list[object]
) -> None:
    history = play(cluster, policy, tree, ops)

    replayed = history.replayed()

    live = {job_id: job.attained_gpu_s for job_id, job in history.state.job_records.items()}
    assert {job_id: job.attained_gpu_s for job_id, job in replayed.job_records.items()} == live


def test_the_property_scenarios_do_evict_for_fairness() -> None:
    """A guard that the scenarios above exercise the rule: one team, long work, then short."""
    policy = SchedulingPolicy(fairness_preemption=True, las_thresholds_gpu_s=(600.0, 6000.0))
    history = History("2x8:2:1", policy=policy).team("alpha", guaranteed=8, max_gpus=8)
    history.submit(a_job().gpus(8).team("alpha"))
    history.run()
    history.advance(1200)
    history.submit(a_job().gpus(2).team("alpha"))
    history.run()
    assert [p.code for p in history.events(PreemptionRequested)] == ["fairness"]


@_examples(0.5)
@given(cluster=clusters, policy=fair_policies, tree=trees, ops=operations)
def test_fairness_walking_only_the_jobs_that_may_act_decides_as_walking_every_job(
    cluster: str, policy: SchedulingPolicy, tree: Tree, ops: list[object]
) -> None:
    """The phase passes over the jobs of queues without a guarantee that never caused a
    preemption (core/fairness.py): every cycle must decide, and wake up, as the walk over
    every waiting job does (the reference, `every_job=True`)."""
    fast = play(cluster, policy, tree, ops)
    with patch.object(core.cycle, "preempt_for_fairness", partial(fair, every_job=True)):
        reference = play(cluster, policy, tree, ops)

    def cycles(history: History) -> list[tuple[list[Event], float | None]]:
        return [(cycle.decisions, cycle.next_wakeup) for cycle in history.cycles]

    assert cycles(fast) == cycles(reference)


def test_a_job_that_preempted_notes_its_calm_even_in_a_queue_without_a_guarantee() -> None:
    """The one thing the phase does for a job of a queue without a guarantee: the end of its
    calm after it caused a preemption is a wake-up. The walk that passes over such queues'
    other jobs keeps it, as the walk over every job does."""
    policy = SchedulingPolicy(fairness_preemption=True, hysteresis_s=600.0)
    history = History("1x8", policy=policy).team("alpha", guaranteed=0)
    victim = history.occupy("n0000", 8)
    waiting = history.submit(a_job().gpus(8).team("alpha"))[0]
    history.record(
        PreemptionRequested(
            job_id=victim, attempt=1, preemptor_job_id=waiting, reason="test", grace_s=30.0
        )
    )
    history.advance(60.0)
    state = history.state
    job = state.job_records[waiting]
    assert job.last_preempting_at is not None
    wakeups = []
    for every_job in (False, True):
        ctx = CycleContext.start(state, history.now)
        ctx.outcomes[waiting] = Outcome("no_capacity", "waiting")
        ctx.released.add(victim)  # its victim released in this cycle: it awaits none
        snap = Snapshot(state.node_records, state.free_masks)
        fair(ctx, snap, [job], QuotaBook(state.queue_records), every_job=every_job)
        wakeups.append(ctx.wakeups)
    assert wakeups[0] == wakeups[1] == [job.last_preempting_at + 600.0]
