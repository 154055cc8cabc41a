"""Properties with preemption for fairness switched on: after every cycle the invariants of
DESIGN §4 and the promises of §3 the auditor checks hold, the same input gives the same
decisions, and a replayed state holds the same attained service.

Thresholds and minimums are small so that the property scenarios (minutes of simulated time)
do climb levels and evict for fairness.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from core import SchedulingPolicy
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
