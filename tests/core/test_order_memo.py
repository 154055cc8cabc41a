"""The order of a cycle asks once what many jobs share (a queue's share and guarantee, a class's
rank, whether a queue stays within its guarantee with so many GPUs, the level of an amount of
service): it must order exactly as each job's key computed on its own, from scratch, would,
and note the same aging wake-ups (core/ordering.py)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from core.attained import job_level
from core.context import CycleContext
from core.ordering import OrderBook, fair_share, gangway_key, is_aged, length_level, order
from core.policy import SchedulingPolicy
from core.quota import QuotaBook
from core.reactions import react
from core.state import CoreJob
from schemas.jobs import JobChanges, JobHeld, JobHoldReleased, JobUpdated
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


# The order kept between cycles (core/ordering.py `OrderBook`): over any history it gives the
# list that every job keyed afresh gives, counts the same candidates and wakes the cycle at
# the same moment. The book lives through the whole history, as a planner's does, and is asked
# after every step; some waiting jobs may have been handled by the reactions.
book_steps = st.lists(
    st.one_of(
        submits,
        submits,
        st.tuples(st.just("cycle")),
        st.tuples(st.just("advance"), st.sampled_from([30.0, 3600.0, 20_000.0])),
        st.tuples(st.just("end"), st.integers(min_value=0, max_value=50), st.sampled_from([0, 1])),
        st.tuples(st.just("hold"), st.integers(min_value=0, max_value=50)),
        st.tuples(st.just("release"), st.integers(min_value=0, max_value=50)),
        st.tuples(
            st.just("update"), st.integers(min_value=0, max_value=50), st.sampled_from(CLASSES)
        ),
        st.tuples(st.just("cancel"), st.integers(min_value=0, max_value=50)),
        st.tuples(st.just("configure"), st.sampled_from(TEAMS), st.sampled_from([0, 4, 16])),
    ),
    min_size=8,
    max_size=50,
)


def _next_wakeup(ctx: CycleContext) -> float | None:
    return min((moment for moment in ctx.wakeups if moment > ctx.now), default=None)


def _asked(history: History, book: OrderBook, handled: int) -> None:
    state = history.state
    fresh = CycleContext.start(state, history.now)
    kept = CycleContext.start(state, history.now)
    # As in a cycle: the reactions release gangs (a preemptor's victims) and handle jobs.
    react(fresh, None)
    react(kept, None)
    waiting = sorted(state.waiting_jobs)
    for job_id in waiting[:handled]:
        fresh.handled.add(job_id)
        kept.handled.add(job_id)
    expected = order(fresh, QuotaBook(state.queue_records))
    ordered = order(kept, QuotaBook(state.queue_records), book)
    assert [job.job_id for job in ordered] == [job.job_id for job in expected]
    assert kept.result.considered == fresh.result.considered
    assert _next_wakeup(kept) == _next_wakeup(fresh)


def _nth(ids: list[str], pick: object) -> str | None:
    assert isinstance(pick, int)
    return ids[pick % len(ids)] if ids else None


@given(
    steps=book_steps,
    guarantees=st.tuples(*(st.sampled_from([0, 2, 4, 8]) for _ in TEAMS)),
    aging=st.sampled_from([3600.0, 6 * 3600.0]),
    handled=st.lists(st.integers(min_value=0, max_value=3), min_size=1, max_size=3),
)
def test_the_kept_order_is_the_order_computed_afresh(
    steps: list[tuple[object, ...]],
    guarantees: tuple[int, ...],
    aging: float,
    handled: list[int],
) -> None:
    history = History("2x8:1:1", policy=SchedulingPolicy(aging_max_wait_s=aging))
    for team, guaranteed in zip(TEAMS, guarantees, strict=True):
        history.team(team, guaranteed=guaranteed)
    book = OrderBook()
    # Two gangs fail after an hour and more: they wait again at a higher level of service.
    earlier = history.submit(*(a_job().team(team).gpus(8).retries(2) for team in TEAMS[:2]))
    history.run()
    _asked(history, book, 0)
    history.advance(5_000.0)
    for job_id in earlier:
        history.exit(job_id, 1)
    history.run()
    for step in steps:
        waiting = sorted(history.state.waiting_jobs)
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
        elif step[0] == "hold":
            if (picked := _nth(waiting, step[1])) is not None:
                history.record(JobHeld(job_id=picked, by="test"))
        elif step[0] == "release":
            if (picked := _nth(waiting, step[1])) is not None:
                history.record(JobHoldReleased(job_id=picked, by="test"))
        elif step[0] == "update":
            if (picked := _nth(waiting, step[1])) is not None:
                assert isinstance(step[2], str)
                changes = JobChanges(priority=step[2], estimated_runtime_s=600.0)
                history.record(JobUpdated(job_id=picked, by="test", changes=changes))
        elif step[0] == "cancel":
            if (picked := _nth(waiting, step[1])) is not None:
                history.cancel(picked)
        elif step[0] == "configure":
            assert isinstance(step[1], str) and isinstance(step[2], int)
            history.queue(step[1], guaranteed=step[2])
        else:
            running = sorted(v.job_id for v in history.state.jobs() if v.state == "running")
            if running:
                assert isinstance(step[1], int) and isinstance(step[2], int)
                history.exit(running[step[1] % len(running)], step[2])
                history.run()
        _asked(history, book, handled[len(history.log) % len(handled)])


def test_a_preemptor_whose_victims_are_released_goes_first_in_the_kept_order() -> None:
    """A waiting job that comes to await victims changes its key without an event of its own:
    the state tells the book, and the preemptor whose victims the reactions release goes
    ahead of a job that has aged."""
    history = History("1x8:1:1", policy=SchedulingPolicy(aging_max_wait_s=3600.0))
    history.team("alpha", guaranteed=8)
    history.team("beta")
    book = OrderBook()
    [victim] = history.submit(a_job().team("beta").gpus(8))
    history.run()
    [aged] = history.submit(a_job().team("beta").gpus(8))
    history.run()
    history.advance(4_000.0)
    [preemptor] = history.submit(a_job().team("alpha").priority("production").gpus(8))
    _asked(history, book, 0)
    history.cycle()
    assert history.state.job_records[preemptor].awaiting_victims == (victim,)
    history.evict(victim)  # its ranks exit: the next reactions release its gang
    # Its queue's guarantee gone, the preemptor's key is no longer worked out with its queue's.
    history.queue("alpha", guaranteed=0)
    _asked(history, book, 0)
    ctx = CycleContext.start(history.state, history.now)
    react(ctx, None)
    ordered = order(ctx, QuotaBook(history.state.queue_records), book)
    assert [job.job_id for job in ordered] == [preemptor, aged]


def _both(history: History, book: OrderBook) -> list[str]:
    """The kept order, checked against the order computed afresh."""
    state = history.state
    kept = order(CycleContext.start(state, history.now), QuotaBook(state.queue_records), book)
    fresh = order(CycleContext.start(state, history.now), QuotaBook(state.queue_records))
    assert [job.job_id for job in kept] == [job.job_id for job in fresh]
    return [job.job_id for job in kept]


def test_the_kept_order_ages_a_job_at_the_exact_moment_past_a_stale_moment() -> None:
    """A job ages when it has waited exactly the policy's maximum, even when the earliest
    moment the book noted is stale (that job was held and released: its clock restarted)."""
    history = History("1x8:1:1", policy=SchedulingPolicy(aging_max_wait_s=3600.0))
    history.team("alpha")
    [restarted] = history.submit(a_job().team("alpha").gpus(8).tasks(2))
    history.advance(10.0)
    [oldest] = history.submit(a_job().team("alpha").gpus(8).tasks(2))
    history.advance(1.0)
    [urgent] = history.submit(a_job().team("alpha").priority("production").gpus(8).tasks(2))
    book = OrderBook()
    assert _both(history, book) == [urgent, restarted, oldest]
    history.record(JobHeld(job_id=restarted, by="test"))
    history.record(JobHoldReleased(job_id=restarted, by="test"))
    history.advance(3_600.0 - 1.0)  # `oldest` has waited exactly 3,600 s
    assert _both(history, book) == [oldest, urgent, restarted]


def test_the_kept_order_merges_only_the_groups_that_tie() -> None:
    """Two idle queues tie (share 0): their jobs are merged by arrival; a queue that has run
    comes after both, although its jobs arrived first."""
    history = History("1x8:1:1")
    for team in ("alpha", "beta", "gamma"):
        history.team(team)
    [running] = history.submit(a_job().team("gamma").gpus(8))
    history.run()
    assert history.state.job_records[running].state in ("reserved", "running")
    history.advance(600.0)
    early = history.submit(*(a_job().team("gamma").gpus(8).tasks(2) for _ in range(2)))
    late = history.submit(
        *(a_job().team(team).gpus(8).tasks(2) for team in ("alpha", "beta", "alpha", "beta"))
    )
    assert _both(history, OrderBook()) == late + early
