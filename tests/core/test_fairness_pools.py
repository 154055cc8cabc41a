"""Preemption for fairness's pools kept between cycles (core/fairness_pools.py) change nothing:
a scheduler that keeps them decides, cycle after cycle, exactly as one that builds every pool
afresh, and asks for the same next wake-up. Random clusters, team trees and job streams (those
of the property tests), with time passing over minimum runtimes, hysteresis and the levels of
attained service."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from core import SchedulingPolicy
from core.context import CycleContext
from core.cycle import Planner
from core.fairness import _level_reached_at
from core.fairness_pools import build_pool, forget, pool_of
from core.state import CoreJob
from tests.core.builders import History
from tests.core.test_properties import (
    Exit,
    Submit,
    Tree,
    Wait,
    clusters,
    configure,
    operations,
    perform,
    trees,
)

fair_policies = st.sampled_from(
    [
        SchedulingPolicy(),
        SchedulingPolicy(aging_max_wait_s=1800.0, hysteresis_s=120.0),
        SchedulingPolicy(fairness_min_runtime_s=60.0, las_thresholds_gpu_s=(600.0, 6000.0)),
    ]
)


# One team at its ceiling, long and short work of one class arriving as time passes: where
# preemption for fairness acts (and its pools are kept), cycle after cycle.
crowded = st.lists(
    st.one_of(
        st.builds(
            Submit,
            gpus=st.sampled_from([1, 1, 2, 4, 8]),
            tasks=st.just(1),
            min_tasks=st.none(),
            tp=st.just(False),
            team=st.sampled_from(["alpha", "alpha", "beta"]),
            priority=st.just("research"),
            estimate=st.sampled_from([None, 600.0, 14_400.0]),
            max_runtime=st.none(),
            min_runtime=st.sampled_from([0.0, 0.0, 300.0]),
            preemptible=st.none(),
            retries=st.just(0),
            gpu_type=st.none(),
            require=st.just("none"),
            prefer=st.just("none"),
            count=st.sampled_from([1, 1, 3]),
        ),
        st.builds(Exit, pick=st.integers(0, 50), code=st.just(0)),
        st.builds(Wait, seconds=st.sampled_from([30.0, 200.0, 450.0, 700.0, 1000.0, 4000.0])),
    ),
    min_size=10,
    max_size=50,
)
crowded_tree = Tree((16, 8, 0, 0), (16, 8, None, None), (1.0,) * 4, (False,) * 4, None)


@settings(max_examples=60, deadline=None)
@given(policy=fair_policies, ops=crowded)
def test_kept_pools_decide_as_pools_built_afresh_where_fairness_preempts(
    policy: SchedulingPolicy, ops: list[object]
) -> None:
    play_both("3x8:1:3", policy, crowded_tree, ops)


@settings(max_examples=40, deadline=None)
@given(cluster=clusters, policy=fair_policies, tree=trees, ops=operations)
def test_kept_pools_decide_as_pools_built_afresh(
    cluster: str, policy: SchedulingPolicy, tree: Tree, ops: list[object]
) -> None:
    play_both(cluster, policy, tree, ops)


def play_both(cluster: str, policy: SchedulingPolicy, tree: Tree, ops: list[object]) -> None:
    """The same log for two schedulers, one keeping its pools, one forgetting them before each
    cycle: the same decisions and wake-ups at every cycle."""
    kept, fresh = History(cluster, policy=policy), History(cluster, policy=policy)
    kept_planner, fresh_planner = Planner(), Planner()
    for history in (kept, fresh):
        configure(history, tree)
    nodes = [view.node_id for view in kept.state.nodes()]
    for number, op in enumerate(ops):
        for history in (kept, fresh):
            if not perform(history, op, f"p{number:03d}", nodes) and isinstance(op, Wait):
                history.advance(op.seconds)
        for _ in range(6):
            result = kept_planner.schedule(kept.state, kept.now)
            forget(fresh.state)
            reference = fresh_planner.schedule(fresh.state, fresh.now)
            assert result.decisions == reference.decisions
            assert result.next_wakeup == reference.next_wakeup
            for decision in result.decisions:
                kept.record(decision)
                fresh.record(decision)
            kept.start_all()
            fresh.start_all()
            if not result.decisions:
                break


@settings(max_examples=60, deadline=None)
@given(policy=fair_policies, ops=crowded)
def test_a_pool_kept_up_to_date_is_the_pool_built_afresh(
    policy: SchedulingPolicy, ops: list[object]
) -> None:
    """Read after every cycle and every passing of time, each queue's kept pool of each class
    (brought up to date gang by gang) holds the gangs, levels and order `build_pool` finds
    from scratch, and adds the same wake-ups."""
    history, planner = History("3x8:1:3", policy=policy), Planner()
    configure(history, crowded_tree)
    nodes = [view.node_id for view in history.state.nodes()]
    ranks = sorted({pc.rank for pc in policy.priority_classes})
    for number, op in enumerate(ops):
        if not perform(history, op, f"p{number:03d}", nodes) and isinstance(op, Wait):
            history.advance(op.seconds)
        for _ in range(6):
            result = planner.schedule(history.state, history.now)
            for decision in result.decisions:
                history.record(decision)
            history.start_all()
            for queue in history.state.queue_records:
                for rank in ranks:
                    kept = CycleContext.start(history.state, history.now)
                    fresh = CycleContext.start(history.state, history.now)
                    pool = pool_of(kept, queue, rank)
                    built, _ = build_pool(fresh, queue, rank, fresh.wakeups)
                    assert [(level, gang.job_id) for level, gang in pool] == [
                        (level, gang.job_id) for level, gang in built
                    ]
                    assert sorted(kept.wakeups) == sorted(fresh.wakeups)
            if not result.decisions:
                break


def climbs_walked(
    pool: list[tuple[int, CoreJob]], needed: int, largest: int | None, ctx: CycleContext
) -> float | None:
    """The first moment a running gang of the pool reaches level `needed`, every gang walked
    (core/fairness.py `_level_reached_at` before it kept the gangs by that moment)."""
    thresholds = ctx.policy.las_thresholds_gpu_s
    if needed < 1 or needed > len(thresholds):
        return None
    threshold, now = thresholds[needed - 1], ctx.now
    soonest: float | None = None
    for _, victim in pool:
        rate = victim.bound_gpus
        started = victim.started_at
        if not victim.ranks or started is None or rate <= 0:
            continue
        if largest is not None and rate > largest:
            continue
        service = victim.attained_gpu_s + rate * max(0.0, now - started)
        moment = now + (threshold - service) / rate + 1e-6
        if soonest is None or moment < soonest:
            soonest = moment
    return soonest


@settings(max_examples=60, deadline=None)
@given(policy=fair_policies, ops=crowded)
def test_the_moment_a_kept_pools_gang_climbs_is_that_of_every_gang_walked(
    policy: SchedulingPolicy, ops: list[object]
) -> None:
    """Read after every cycle and every passing of time (a kept pool is the same list from
    cycle to cycle while none of its gangs changed), the first moment a gang of each queue's
    pool below each level reaches it is the moment found by walking every such gang at `now`,
    to the float."""
    history, planner = History("3x8:1:3", policy=policy), Planner()
    configure(history, crowded_tree)
    nodes = [view.node_id for view in history.state.nodes()]
    ranks = sorted({pc.rank for pc in policy.priority_classes})
    levels = range(len(policy.las_thresholds_gpu_s) + 2)
    for number, op in enumerate(ops):
        if not perform(history, op, f"p{number:03d}", nodes) and isinstance(op, Wait):
            history.advance(op.seconds)
        for _ in range(6):
            result = planner.schedule(history.state, history.now)
            for decision in result.decisions:
                history.record(decision)
            history.start_all()
            for queue in history.state.queue_records:
                for rank in ranks:
                    ctx = CycleContext.start(history.state, history.now)
                    pool = pool_of(ctx, queue, rank)
                    for needed in levels:
                        index = next(
                            (i for i, (level, _) in enumerate(pool) if level < needed), len(pool)
                        )
                        for largest in (None, policy.fairness_protected_gang_gpus, 1):
                            climb = (queue, rank, needed, largest)
                            assert _level_reached_at(pool, index, climb, ctx) == climbs_walked(
                                pool[index:], needed, largest, ctx
                            )
            if not result.decisions:
                break
