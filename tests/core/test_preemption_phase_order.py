"""The preemption phase walks the blocked jobs in line (DESIGN §3, preemption): a job that
evicts no one this cycle (a CPU-only gang, a preemptor within its own hysteresis, a job that
may not preempt, a best-effort job, a shape that already found no victims) is passed over,
never the end of the phase for the jobs after it; a shape that found no victims for one
team's job is still planned for another team's; and a preemptor may preempt again the
moment its own hysteresis is over."""

from __future__ import annotations

from schemas.jobs import PreemptionRequested
from tests.core.builders import History, a_job

ONE_NODE_32_CPUS = "rack_size: 1\ngroups:\n  - {count: 1, gpus: 8, cpus: 32}\n"


def victims(history: History) -> list[str]:
    return [p.job_id for p in history.events(PreemptionRequested)]


def preemptors(history: History) -> list[str]:
    return [str(p.preemptor_job_id) for p in history.events(PreemptionRequested)]


def test_a_waiting_cpu_only_job_ahead_in_line_does_not_end_the_phase() -> None:
    # A research gang holds every GPU and every CPU. A CPU-only production job, older than the
    # production preemptor and so ahead of it in line, waits for CPUs and evicts no one; the
    # preemptor after it still evicts the research gang.
    history = History(ONE_NODE_32_CPUS)
    research = history.submit(a_job().gpus(8).cpus(32).priority("research"))[0]
    history.run()
    cpu_only = history.submit(a_job().cpu_only(2).priority("production"))[0]
    preemptor = history.submit(a_job().gpus(8).priority("production"))[0]

    history.cycle()

    assert victims(history) == [research]
    assert preemptors(history) == [preemptor]
    assert history.job(cpu_only).state == "queued"


def test_an_aged_job_that_may_not_preempt_does_not_end_the_phase() -> None:
    # A research job waited the policy's aging bound (6 h): it goes first in line, whatever its
    # class, but a research job may not preempt (and its team has no guarantee to reclaim).
    # The production job behind it still evicts the running research gang.
    history = History("1x8:1:1")
    running = history.submit(a_job().gpus(8).priority("research"))[0]
    history.run()
    aged = history.submit(a_job().gpus(8).priority("research"))[0]
    history.run()
    history.advance(6 * 3600)
    preemptor = history.submit(a_job().gpus(8).priority("production"))[0]

    history.cycle()

    assert victims(history) == [running]
    assert preemptors(history) == [preemptor]
    assert history.job(aged).state == "queued"


def test_a_best_effort_job_within_its_guarantee_does_not_end_the_phase() -> None:
    # Team beta's best-effort job is within beta's guarantee, so it goes first in line and
    # may reclaim; but best-effort runs on idle capacity only and evicts no one. The
    # production job of the team after it still evicts that team's own research gang.
    history = History("1x8:1:1")
    history.team("beta", guaranteed=8)
    running = history.submit(a_job().gpus(8).priority("research"))[0]
    history.run()
    idle_only = history.submit(a_job().gpus(8).team("beta").priority("best-effort"))[0]
    preemptor = history.submit(a_job().gpus(8).priority("production"))[0]

    history.cycle()

    assert victims(history) == [running]
    assert preemptors(history) == [preemptor]
    assert history.job(idle_only).state == "queued"


def test_a_shape_that_found_no_victims_is_skipped_and_the_next_shape_still_plans() -> None:
    # Seven GPUs of the node hold a gang that may not be preempted, one a research gang. Two
    # production jobs of 8 GPUs find no victims (the first plans and fails, the second, of the
    # same shape, is skipped without planning); a 1-GPU production job after them evicts the
    # research gang.
    history = History("1x8:1:1")
    history.occupy("n0000", 7)
    research = history.occupy("n0000", 1, a_job().priority("research"))
    history.submit(*(a_job().gpus(8).priority("production") for _ in range(2)))
    small = history.submit(a_job().gpus(1).priority("production"))[0]

    history.cycle()

    assert victims(history) == [research]
    assert preemptors(history) == [small]


def test_a_shape_that_found_no_victims_for_one_team_is_still_planned_for_another() -> None:
    # Team beta's research gang is within beta's guarantee: no other team may take it, but
    # beta's own production job may (a lower class of its own queue). Alpha's production job
    # of the same shape is first in line and finds no victim; beta's still evicts the gang.
    history = History("1x8:1:1").team("alpha").team("beta", guaranteed=4)
    history.occupy("n0000", 4)
    own = history.occupy("n0000", 4, a_job().team("beta").priority("research"))
    history.submit(a_job().gpus(4).team("alpha").priority("production"))
    beta = history.submit(a_job().gpus(4).team("beta").priority("production"))[0]

    history.cycle()

    assert victims(history) == [own]
    assert preemptors(history) == [beta]


def _preemptor_preempted_within_its_hysteresis(history: History) -> tuple[str, str, float]:
    """`first` (production) evicts a best-effort gang at T0 and runs; 60 s later an
    inference-critical job evicts `first` (the research gang beside it is younger than its
    5-minute minimum runtime). Returns (first, research, T0), the clock at T0 + 300 s, when
    the research gang's minimum runtime is over and `first` waits within its hysteresis."""
    best_effort = history.submit(a_job().gpus(8).priority("best-effort"))[0]
    research = history.submit(a_job().gpus(8).priority("research").min_runtime(300))[0]
    history.run(every_s=0)
    first = history.submit(a_job().gpus(8).priority("production"))[0]
    history.cycle()
    preempted_at = history.now
    assert victims(history) == [best_effort]
    history.evict(best_effort)
    history.run(every_s=0)
    assert history.job(first).state == "running"

    history.advance(60)
    history.submit(a_job().gpus(8).priority("inference-critical"))
    history.cycle()
    assert victims(history) == [best_effort, first]
    history.evict(first)
    history.run(every_s=0)
    assert history.job(first).state == "queued"

    history.advance(preempted_at + 300 - history.now)
    return first, research, preempted_at


def test_a_preemptor_within_its_own_hysteresis_does_not_end_the_phase() -> None:
    history = History("2x8:2:1")
    first, research, _ = _preemptor_preempted_within_its_hysteresis(history)
    second = history.submit(a_job().gpus(8).priority("production"))[0]

    history.cycle()

    # `first` is ahead of `second` in line (the older of two production jobs) but within its
    # hysteresis; `second` evicts the research gang.
    assert victims(history)[-1] == research
    assert preemptors(history)[-1] == second
    assert history.job(first).state == "queued"


def test_a_preemptor_may_preempt_again_the_moment_its_own_hysteresis_is_over() -> None:
    history = History("2x8:2:1")
    first, research, preempted_at = _preemptor_preempted_within_its_hysteresis(history)

    history.cycle()
    assert len(victims(history)) == 2  # within its hysteresis: no plan
    assert history.cycles[-1].next_wakeup == preempted_at + 600  # it wakes when that ends

    history.advance(preempted_at + 600 - history.now)  # the policy's hysteresis_s
    history.cycle()
    assert victims(history)[-1] == research
    assert preemptors(history)[-1] == first


def test_a_preemptor_awaiting_its_victims_does_not_end_the_phase() -> None:
    # The first production job's victim still checkpoints: it evicts no one more this cycle
    # and waits. The production job behind it in line still evicts the other research gang.
    history = History("2x8:2:1")
    first_victim = history.submit(a_job().gpus(8).priority("research"))[0]
    second_victim = history.submit(a_job().gpus(8).priority("research"))[0]
    history.run()
    first = history.submit(a_job().gpus(8).priority("production"))[0]
    history.cycle()
    assert victims(history) == [first_victim]
    history.advance(1)
    second = history.submit(a_job().gpus(8).priority("production"))[0]

    history.cycle()

    assert victims(history) == [first_victim, second_victim]
    assert preemptors(history) == [first, second]
