"""The order of a cycle asks once what many jobs share (a queue's share and guarantee, a class's
rank, whether a queue stays within its guarantee with so many GPUs, the level of an amount of
service): it must order exactly as each job's key computed on its own, from scratch, would,
and note the same aging wake-ups (core/ordering.py)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from core.attained import job_level
from core.context import CycleContext
from core.ordering import fair_share, gangway_key, is_aged, length_level, order
from core.quota import QuotaBook
from core.state import CoreJob
from tests.core.builders import History, a_job

TEAMS = ("alpha", "beta", "gamma")
CLASSES = ("production", "research", "best-effort", "no-such-class")


def _from_scratch(ctx: CycleContext, quota: QuotaBook) -> tuple[list[str], list[float]]:
    """Each waiting job's key on its own, as the order was computed before it shared anything."""
    state, policy, now = ctx.state, ctx.policy, ctx.now
    keyed: list[tuple[tuple[float, ...], CoreJob]] = []
    wakeups: list[float] = []
    for job in state.waiting_jobs.values():
        if job.job_id in ctx.handled:
            continue
        share = fair_share(state.queue_records.get(job.queue), now, policy, state.host_capacity())
        aged = is_aged(job, now, policy)
        if not aged and job.queued_at is not None:
            wakeups.append(job.queued_at + policy.aging_max_wait_s)
        shape = job.shape
        within = shape is not None and quota.within_guarantee(job.queue, shape.min_gpus)
        if not within and quota.guarantee(job.queue) > 0:
            share = 0.0
        length = length_level(job, ctx) if within and not aged else 0
        rank = policy.priority_class(job.priority).rank
        level = job_level(job, now, policy)
        released = ctx.victims_released(job)
        keyed.append((gangway_key(job, rank, share, aged, released, within, level, length), job))
    keyed.sort(key=lambda pair: pair[0])
    return [job.job_id for _, job in keyed], wakeups


submits = st.tuples(
    st.just("submit"),
    st.sampled_from(TEAMS),
    st.sampled_from(CLASSES),
    st.sampled_from([1, 2, 4, 8]),
    st.sampled_from([1, 2]),
    st.sampled_from([300.0, 3600.0, 86_400.0]),
)
# Mostly submissions, so that jobs wait on the two nodes; attempts that fail after hours come
# back to wait with the service they received.
steps = st.lists(
    st.one_of(
        submits,
        submits,
        st.tuples(st.just("cycle")),
        st.tuples(st.just("advance"), st.sampled_from([30.0, 3600.0, 20_000.0, 200_000.0])),
        st.tuples(st.just("end"), st.integers(min_value=0, max_value=50), st.sampled_from([0, 1])),
    ),
    min_size=8,
    max_size=40,
)


@given(
    steps=steps,
    guarantees=st.tuples(*(st.sampled_from([0, 2, 4, 8]) for _ in TEAMS)),
)
def test_the_order_is_each_jobs_key_computed_on_its_own(
    steps: list[tuple[object, ...]], guarantees: tuple[int, ...]
) -> None:
    history = History("2x8:1:1")
    for team, guaranteed in zip(TEAMS, guarantees, strict=True):
        history.team(team, guaranteed=guaranteed)
    # Two gangs fail after an hour and more: they wait again at a higher level of service.
    earlier = history.submit(*(a_job().team(team).gpus(8).retries(2) for team in TEAMS[:2]))
    history.run()
    history.advance(5_000.0)
    for job_id in earlier:
        history.exit(job_id, 1)
    history.run()
    for step in steps:
        if step[0] == "submit":
            _, owner, klass, gpus, tasks, estimate = step
            assert isinstance(owner, str) and isinstance(klass, str)
            assert isinstance(gpus, int) and isinstance(tasks, int)
            assert isinstance(estimate, float)
            job = a_job().team(owner).priority(klass).gpus(gpus).tasks(tasks).estimate(estimate)
            history.submit(job.retries(2))
        elif step[0] == "cycle":
            history.run()
        elif step[0] == "advance":
            assert isinstance(step[1], float)
            history.advance(step[1])
        else:
            running = sorted(v.job_id for v in history.state.jobs() if v.state == "running")
            if running:
                # A failed attempt is retried: the job waits again with the service it got.
                assert isinstance(step[1], int) and isinstance(step[2], int)
                history.exit(running[step[1] % len(running)], step[2])
                history.run()

    state = history.state
    ctx = CycleContext.start(state, history.now)
    expected, expected_wakeups = _from_scratch(ctx, QuotaBook(state.queue_records))
    ordered = order(ctx, QuotaBook(state.queue_records))

    assert [job.job_id for job in ordered] == expected
    assert sorted(ctx.wakeups) == sorted(expected_wakeups)
