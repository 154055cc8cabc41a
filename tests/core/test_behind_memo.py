"""Behind the head, a job that fits nowhere takes the outcome of the last job of its shape and
`avoid` while the placement snapshot is unchanged (core/backfill.py `place`): a planner that
answers so decides, cycle after cycle, exactly as one that works out every job's outcome on
its own, reasons (`JobDeferred`) included. Random clusters, policies and job streams (those of
the property tests), and a case built so that a kept answer goes stale within one cycle.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from core import SchedulingPolicy
from core.cycle import Planner
from schemas.jobs import JobDeferred
from tests.core.builders import History, a_job
from tests.core.test_host_quota import CLUSTER, capped
from tests.core.test_properties import Wait, clusters, perform, policies
from tests.core.test_timers import operations


def cycles_agree(history: History, planner: Planner) -> None:
    """Cycles until nothing new, each decided by the planner and by one without the memo."""
    for _ in range(6):
        result = planner.schedule(history.state, history.now)
        reference = Planner(behind_memo=False).schedule(history.state, history.now)
        assert result.decisions == reference.decisions
        if not result.skipped:  # a quiet cycle's memo answers with no head of its own
            assert result.head_job_id == reference.head_job_id
        for decision in result.decisions:
            history.record(decision)
        history.start_all()
        if not result.decisions:
            return


@given(cluster=clusters, policy=policies, ops=operations)
def test_outcomes_kept_per_shape_behind_the_head_are_each_jobs_own(
    cluster: str, policy: SchedulingPolicy, ops: list[object]
) -> None:
    history = History(cluster, policy=policy)
    planner = Planner()
    nodes = [view.node_id for view in history.state.nodes()]
    for number, op in enumerate(ops):
        if not perform(history, op, f"t{number:03d}", nodes) and isinstance(op, Wait):
            history.advance(op.seconds)
        cycles_agree(history, planner)


def test_a_kept_outcome_is_worked_out_again_once_a_job_between_changed_the_snapshot() -> None:
    # The head (16 GPUs) holds a reservation on both nodes; 4 GPUs are free on one of them.
    # A long 4-GPU job would fit there but for the reservation ("backfill_blocked"); a short
    # job of the same shape, next in line, backfills onto those GPUs; the next long job of
    # that shape then fits nowhere at all: its reason is not the first one's.
    history = History("2x8:2:1")
    history.submit(a_job().gpus(8).estimate(3600), a_job().gpus(4).estimate(3600))
    history.run()
    head = history.submit(a_job().gpus(8).tasks(2).estimate(600))[0]
    first, short, second = history.submit(
        a_job().gpus(4).estimate(10 * 3600),
        a_job().gpus(4).estimate(600),
        a_job().gpus(4).estimate(10 * 3600),
    )

    decisions = Planner().schedule(history.state, history.now).decisions

    reasons = {d.job_id: d.code for d in decisions if isinstance(d, JobDeferred)}
    assert reasons[first] == "backfill_blocked"
    assert short not in reasons  # placed
    assert reasons[second] == "no_capacity"
    assert decisions == Planner(behind_memo=False).schedule(history.state, history.now).decisions
    assert head in reasons


behind = st.lists(
    st.tuples(
        st.sampled_from([1, 2, 4, 8]),
        st.sampled_from([1, 1, 2]),
        st.sampled_from([300.0, 600.0, 36_000.0]),
    ),
    min_size=4,
    max_size=24,
)


@given(
    running=st.lists(
        st.tuples(st.sampled_from([2, 4, 8]), st.sampled_from([600.0, 3600.0])), max_size=6
    ),
    head_tasks=st.sampled_from([2, 3, 4]),
    queue=behind,
    ends=st.lists(st.integers(min_value=0, max_value=20), max_size=4),
)
def test_a_line_of_few_shapes_behind_a_head_gets_each_jobs_own_outcome(
    running: list[tuple[int, float]],
    head_tasks: int,
    queue: list[tuple[int, int, float]],
    ends: list[int],
) -> None:
    # The bench's pattern in small: a busy cluster, a wide head that holds a reservation, and
    # a line of a few shapes, short and long, some backfilling between the others.
    history = History("4x8:2:2")
    history.submit(*(a_job().gpus(gpus).estimate(estimate) for gpus, estimate in running))
    history.run()
    history.submit(a_job().gpus(8).tasks(head_tasks).estimate(1800))
    history.submit(
        *(a_job().gpus(gpus).tasks(tasks).estimate(estimate) for gpus, tasks, estimate in queue)
    )
    planner = Planner()
    cycles_agree(history, planner)
    holding = [view.job_id for view in history.state.jobs() if view.state == "running"]
    for pick in ends:
        if holding:
            history.exit(holding.pop(pick % len(holding)), 0)
    history.advance(60)
    cycles_agree(history, planner)


def test_a_gang_cut_down_by_a_cpu_ceiling_lends_its_outcome_to_no_other_gang() -> None:
    # An elastic gang of 4 tasks cut to 2 by its queue's CPU ceiling has the shape of a
    # 2-task gang, but not its need: the 2-task gang behind it words its own reason.
    history = capped(History(CLUSTER), "team-a", max_cpus=2)
    history.submit(*(a_job().team("team-a").gpus(8).estimate(3600) for _ in range(4)))
    history.run()
    history.submit(a_job().team("team-a").gpus(8).tasks(2).estimate(600))
    elastic, whole = history.submit(
        a_job().team("team-a").gpus(1).tasks(4).min_tasks(2).cpus(1).estimate(36_000),
        a_job().team("team-a").gpus(1).tasks(2).cpus(1).estimate(36_000),
    )

    decisions = Planner().schedule(history.state, history.now).decisions

    reasons = {d.job_id: d.message for d in decisions if isinstance(d, JobDeferred)}
    assert reasons[elastic].startswith("needs 4 GPUs (4 tasks x 1)")
    assert reasons[whole].startswith("needs 2 GPUs (2 tasks x 1)")
    assert decisions == Planner(behind_memo=False).schedule(history.state, history.now).decisions


def test_a_shape_that_fails_both_ways_with_different_outcomes_keeps_each_outcome() -> None:
    # The head (8 GPUs) is planned on n0001, where a gang holding 4 GPUs and 200 GB ends in
    # 1 h; n0000 is full for 2 h. Behind it, jobs of one shape (1 GPU, 100 GB) fail both ways:
    # a long one, kept off the reserved n0001, waits for GPUs ("no_capacity"); a short one, that
    # may use n0001, waits for memory there. Jobs of that shape after both take their own
    # `avoid`'s outcome, not the last one recorded.
    history = History("groups:\n  - {count: 2, gpus: 8, cpus: 32, memory_mb: 262144}\n")
    history.occupy("n0000", 8, a_job().preemptible(False).estimate(2 * 3600.0))
    history.occupy("n0001", 4, a_job().preemptible(False).estimate(3600.0).memory(200_000))
    head = history.submit(a_job().gpus(8))[0]
    long_1, short, long_2 = history.submit(
        a_job().gpus(1).memory(100_000).estimate(4 * 3600.0),
        a_job().gpus(1).memory(100_000).estimate(600.0),
        a_job().gpus(1).memory(100_000).estimate(4 * 3600.0),
    )

    history.cycle()

    assert history.job(head).reason_code == "reserved_head"
    assert history.job(short).reason_code == "insufficient_memory"
    assert history.job(long_1).reason_code == "no_capacity"
    assert history.job(long_2).reason_code == "no_capacity"
    cycles_agree(history, Planner())
