"""The order kept between cycles (core/ordering.py `OrderBook`) where the kept groups meet the
jobs keyed one by one, and where the book tidies itself: each case gives the order written
out by hand, and the same as the order computed afresh (`order` without a book)."""

from __future__ import annotations

from core.context import CycleContext
from core.ordering import OrderBook, order
from core.policy import SchedulingPolicy
from core.quota import QuotaBook
from core.reactions import react
from schemas.jobs import JobCancelled, JobHeld, JobHoldReleased
from tests.core.builders import History, a_job


def _ordered(history: History, book: OrderBook | None) -> list[str]:
    """The cycle's order at the history's moment, after the reactions, with the book or not."""
    state = history.state
    ctx = CycleContext.start(state, history.now)
    react(ctx, None)
    return [job.job_id for job in order(ctx, QuotaBook(state.queue_records), book)]


def _both(history: History, book: OrderBook) -> list[str]:
    kept = _ordered(history, book)
    assert kept == _ordered(history, None)
    # And a book built now, from the waiting jobs as the state lists them.
    assert _ordered(history, OrderBook()) == kept
    return kept


def test_a_preemptor_awaiting_its_victims_keeps_its_place_by_arrival_in_its_class() -> None:
    """A production job that preempts a research gang waits for its victims to go; meanwhile
    it is ordered with the other production jobs of its queue (no guarantee) by arrival, as
    every one of them: after the one submitted before it, before the one submitted after."""
    history = History("1x8:1:1")
    history.team("alpha").team("beta")
    book = OrderBook()
    [victim] = history.submit(a_job().team("beta").priority("research").gpus(8))
    history.run()
    history.advance(100.0)
    # Held while the preemptor comes, so that it is not the one that preempts.
    [earlier] = history.submit(a_job().team("alpha").priority("production").gpus(8))
    history.record(JobHeld(job_id=earlier, by="test"))
    history.advance(1.0)
    [preemptor] = history.submit(a_job().team("alpha").priority("production").gpus(8))
    _both(history, book)
    history.cycle()
    assert history.state.job_records[preemptor].awaiting_victims == (victim,)
    history.advance(1.0)
    [later] = history.submit(a_job().team("alpha").priority("production").gpus(8))
    history.record(JobHoldReleased(job_id=earlier, by="test"))

    assert _both(history, book) == [earlier, preemptor, later]


def test_the_kept_order_still_ages_its_jobs_after_most_of_them_left() -> None:
    """Many waiting jobs cancelled at once leave the book's aging moments mostly stale; those
    of the jobs still waiting stand: once they have waited the policy's maximum they age, and
    the oldest, a best-effort job, goes ahead of the research jobs."""
    history = History("1x8:1:1", policy=SchedulingPolicy(aging_max_wait_s=3600.0))
    history.team("alpha")
    [oldest] = history.submit(a_job().team("alpha").priority("best-effort").gpus(8).tasks(2))
    history.advance(1.0)
    research = history.submit(
        *(a_job().team("alpha").priority("research").gpus(8).tasks(2) for _ in range(39))
    )
    book = OrderBook()
    assert _both(history, book) == [*research, oldest]
    kept = research[:2]
    for job_id in research[2:]:
        history.record(JobCancelled(job_id=job_id, reason="not needed"))
    assert _both(history, book) == [*kept, oldest]
    history.advance(3_600.0)

    assert _both(history, book) == [oldest, *kept]


def test_each_order_counts_the_waiting_jobs_it_considered() -> None:
    """The cycle's figure of jobs considered: the waiting jobs not handled by the reactions,
    under fifo, under an order given by the operator, and under gangway's own order."""
    policies = (
        SchedulingPolicy(name="fifo"),
        SchedulingPolicy(order_key=lambda job_id: (0.0,)),
        SchedulingPolicy(),
    )
    for policy in policies:
        history = History("1x8:1:1", policy=policy)
        history.team("alpha")
        waiting = history.submit(*(a_job().team("alpha").gpus(8).tasks(2) for _ in range(3)))
        for book in (None, OrderBook()):
            ctx = CycleContext.start(history.state, history.now)
            ctx.handled.add(waiting[0])
            ordered = order(ctx, QuotaBook(history.state.queue_records), book)
            assert [job.job_id for job in ordered] == waiting[1:]
            assert ctx.result.considered == 2
