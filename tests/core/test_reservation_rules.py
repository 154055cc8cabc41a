"""When a running gang frees its GPUs, and so when the head's reservation starts (DESIGN §3
"Backfill with reservations": plan the head's earliest start on concrete nodes from runtime
estimates).

A gang holds its GPUs from its start (else its binding) for its runtime estimate; one being
preempted leaves by its grace deadline; one past its estimate may end any moment, so it is
planned to end `overrun_grace_s` after now and counts as overrunning only once past it.
"""

from __future__ import annotations

import pytest

from core import SchedulingPolicy
from core.reservation import (
    MAX_PLANNED_RUNTIME_S,
    estimated_end,
    has_overrun,
    runtime_estimate,
)
from core.state import CoreJob, JobStateName
from schemas.jobs import ReservationPlanned
from tests.core.builders import T0, History, JobBuilder, a_job

HOUR = 3600.0
POLICY = SchedulingPolicy(default_runtime_estimate_s=4 * HOUR, overrun_grace_s=300.0)


def _holding(
    builder: JobBuilder,
    state: JobStateName = "running",
    reserved_at: float | None = T0,
    started_at: float | None = None,
) -> CoreJob:
    return CoreJob(
        job_id=builder.job_id,
        seq=1,
        spec=builder.spec(),
        state=state,
        shape=None,
        submitted_at=T0,
        reserved_at=reserved_at,
        started_at=started_at,
    )


@pytest.mark.parametrize(
    ("builder", "seconds"),
    [
        (a_job().estimate(HOUR).max_runtime(2 * HOUR), HOUR),  # the estimate, within the limit
        (a_job().estimate(HOUR), HOUR),
        (a_job().max_runtime(2 * HOUR), 2 * HOUR),  # only a limit: the gang holds until it
        (a_job(), 4 * HOUR),  # neither: the policy's default
    ],
)
def test_the_runtime_estimate_is_the_users_estimate_else_the_limit_else_the_default(
    builder: JobBuilder, seconds: float
) -> None:
    assert runtime_estimate(_holding(builder), POLICY) == seconds


def test_a_gang_ends_its_estimate_after_it_started_not_after_it_was_bound() -> None:
    job = _holding(a_job().estimate(HOUR), reserved_at=T0, started_at=T0 + 60)

    assert estimated_end(job, T0 + 600, POLICY) == T0 + 60 + HOUR


def test_a_bound_gang_whose_ranks_have_not_started_ends_its_estimate_after_its_binding() -> None:
    job = _holding(a_job().estimate(HOUR), state="reserved", reserved_at=T0 + 30)

    assert estimated_end(job, T0 + 600, POLICY) == T0 + 30 + HOUR


def test_a_gang_at_or_past_its_estimate_is_planned_to_end_the_overrun_grace_after_now() -> None:
    job = _holding(a_job().estimate(HOUR), started_at=T0)

    assert estimated_end(job, T0 + HOUR - 1, POLICY) == T0 + HOUR
    assert estimated_end(job, T0 + HOUR, POLICY) == T0 + HOUR + 300
    assert estimated_end(job, T0 + 2 * HOUR, POLICY) == T0 + 2 * HOUR + 300


def test_a_gang_being_preempted_ends_by_its_grace_deadline_whatever_its_estimate() -> None:
    job = _holding(a_job().estimate(10 * HOUR), state="preempting", started_at=T0)
    job.preempt_requested_at = T0 + HOUR
    job.preempt_grace_s = 120.0

    assert estimated_end(job, T0 + HOUR + 10, POLICY) == T0 + HOUR + 120
    # Past its deadline it is leaving now (the agents are stopping it), not in the past.
    assert estimated_end(job, T0 + HOUR + 500, POLICY) == T0 + HOUR + 500


def test_a_gang_overruns_only_once_strictly_past_its_estimate() -> None:
    job = _holding(a_job().estimate(HOUR), started_at=T0)
    waiting = _holding(a_job().estimate(HOUR), state="queued", reserved_at=None)

    assert not has_overrun(job, T0 + HOUR, POLICY)
    assert has_overrun(job, T0 + HOUR + 1, POLICY)
    assert not has_overrun(waiting, T0 + 10 * HOUR, POLICY)


def test_a_gang_without_estimate_or_limit_overruns_past_the_policys_default_estimate() -> None:
    job = _holding(a_job(), started_at=T0)

    assert not has_overrun(job, T0 + 4 * HOUR, POLICY)
    assert has_overrun(job, T0 + 4 * HOUR + 1, POLICY)


def test_the_heads_reservation_counts_a_gang_bound_this_cycle_until_its_estimate_ends() -> None:
    # Node n0 runs a 1 h gang; in one cycle a 2 h gang is placed on the free node n1 and the
    # 16-GPU head, behind it, must be planned when the later of the two ends (2 h), not
    # when the first one does.
    history = History("2x8:2:1")
    history.submit(a_job().gpus(8).estimate(HOUR).priority("production"))
    history.run()
    history.submit(
        a_job().gpus(8).estimate(2 * HOUR).priority("production"),
        a_job().gpus(8).tasks(2).estimate(600).priority("research"),
    )
    now = history.now

    history.run()

    head = history.events(ReservationPlanned)
    assert len(head) == 1
    assert head[0].start_at.timestamp() == now + 2 * HOUR


def test_a_typed_heads_plan_counts_only_the_gangs_on_nodes_of_its_gpu_type() -> None:
    # The A100 gang ends first, but its GPUs are no use to an H100 head: the head starts when
    # the second H100 node frees (3 h), on the two H100 nodes.
    history = History(
        "groups:\n- {count: 1, gpus: 8, gpu_type: A100}\n- {count: 2, gpus: 8, gpu_type: H100}\n"
    )
    for node, hours in (("n0000", 1), ("n0001", 2), ("n0002", 3)):
        history.occupy(node, 8, a_job().preemptible(False).estimate(hours * HOUR))
    history.submit(a_job().gpus(8).tasks(2).gpu_type("H100"))

    history.run()

    [planned] = history.events(ReservationPlanned)
    assert (planned.start_at.timestamp(), planned.nodes) == (T0 + 3 * HOUR, ["n0001", "n0002"])


# ------------------------------------------------- the planner's bounded cost (EAGER_TRIES)


def _one_gpu_gangs(history: History, layout: list[str]) -> None:
    """The k-th gang (from 1) on node layout[k-1], started now, estimated to end k*100 s later."""
    for k, node in enumerate(layout, start=1):
        history.occupy(node, 1, a_job().preemptible(False).estimate(k * 100.0))


def test_the_head_is_planned_when_one_node_is_whole_not_when_enough_gpus_are_free() -> None:
    # n0 and n1 each run two 4-GPU gangs. 8 GPUs are free (4 + 4) once the 2 h gang ends, but
    # the head's single 8-GPU task needs one NVLink domain: n0 is whole at 3 h, the head's start.
    history = History("2x8:2:1")
    for node, hours in (("n0000", 1), ("n0001", 2), ("n0000", 3), ("n0001", 10)):
        history.occupy(node, 4, a_job().preemptible(False).estimate(hours * HOUR))
    history.submit(a_job().gpus(8))

    history.run()

    [planned] = history.events(ReservationPlanned)
    assert (planned.start_at.timestamp(), planned.nodes) == (T0 + 3 * HOUR, ["n0000"])


def test_within_sixteen_tries_the_planner_tries_every_end_so_the_start_is_the_earliest() -> None:
    # 24 one-GPU gangs ending every 100 s round-robin over 3 nodes: n0 is whole first, at its
    # last gang's end (2,200 s). Tries begin once 8 GPUs are free (800 s); the 15th, at 2,200 s,
    # finds the head's node: the earliest start exactly.
    history = History("3x8:3:1")
    _one_gpu_gangs(history, [f"n000{k % 3}" for k in range(24)])
    history.submit(a_job().gpus(8))

    history.run()

    [planned] = history.events(ReservationPlanned)
    assert (planned.start_at.timestamp(), planned.nodes) == (T0 + 2200, ["n0000"])


def test_past_sixteen_failed_tries_the_planner_retries_once_a_unit_more_is_free() -> None:
    # 32 one-GPU gangs ending every 100 s round-robin over 4 nodes; an 8-GPU head needs a whole
    # node, first whole at 2,900 s (n0's last gang). 8 GPUs are free from 800 s: the planner
    # tries at each end up to 2,300 s (16 tries), then only when 8 more GPUs have been freed
    # since its last try: at 3,100 s, where the head fits. The cost stays bounded; the start is
    # late by less than the time to free one more unit.
    history = History("4x8:4:1")
    _one_gpu_gangs(history, [f"n000{k % 4}" for k in range(32)])
    history.submit(a_job().gpus(8))

    history.run()

    [planned] = history.events(ReservationPlanned)
    assert planned.start_at.timestamp() == T0 + 3100


def test_a_head_that_fits_only_after_the_last_untried_end_is_planned_at_that_end() -> None:
    # Three nodes have a broken GPU (7 usable each): only n0003 can ever hold the 8-GPU head,
    # and it is whole only when its last gang ends, the 29th and last end (2,900 s). The 16
    # tries (800 s to 2,300 s) fail and the 6 GPUs freed after them are less than one unit,
    # so the loop tries no more; the final look at the fully released plan finds the start.
    history = History("4x8:4:1")
    for node in ("n0000", "n0001", "n0002"):
        history.break_gpu(node, 7)
    others = iter(["n0000", "n0001", "n0002"] * 7)
    layout = ["n0003" if k % 4 == 1 else next(others) for k in range(1, 30)]
    _one_gpu_gangs(history, layout)
    history.submit(a_job().gpus(8))

    history.run()

    [planned] = history.events(ReservationPlanned)
    assert (planned.start_at.timestamp(), planned.nodes) == (T0 + 2900, ["n0003"])


# ------------------------------------------------- ranks of a released gang, still stopping


def test_a_head_behind_a_released_gangs_stopping_ranks_is_planned_the_overrun_grace_after_now() -> (
    None
):
    # A production job preempts the best-effort gang on the only node; its grace is over and
    # the gang is released, but its ranks have not exited yet (a rank may take its stop
    # timeout to die): their GPUs go to nobody until they do. They end any moment, as an
    # overrunning gang does, so the head is planned there `overrun_grace_s` after now; it used
    # to get no reservation and read "it does not fit even when the running gangs end".
    history = History("1x8", POLICY)
    best_effort = history.submit(a_job().gpus(8).priority("best-effort"))[0]
    history.run()
    head = history.submit(a_job().gpus(8).priority("production"))[0]
    history.cycle()
    assert history.job(best_effort).state == "preempting"
    history.advance(POLICY.preemption_grace_s + 1)

    history.cycle()  # the grace is over: the gang is released, its ranks still run

    assert history.job(best_effort).state == "queued"
    assert history.job(head).state == "queued"
    assert history.job(head).reason_code == "reserved_head"
    planned = history.events(ReservationPlanned, head)[-1]
    assert (planned.start_at.timestamp(), planned.nodes) == (
        history.now + POLICY.overrun_grace_s,
        ["n0000"],
    )
    history.advance(1)
    history.cycle()  # a later cycle: the ranks linger on their node
    assert history.job(head).reason_code == "reserved_head"

    history.exit(best_effort, -9, reason="stopped")
    history.cycle()

    assert history.job(head).state == "reserved"
    assert history.auditor.violations == []


def test_a_typed_head_counts_the_stopping_ranks_of_every_gang_released_on_its_gpu_type() -> None:
    # Two best-effort gangs share the only H100 node; an H100 production job preempts both,
    # and both are released in one cycle with their ranks still stopping. Those ranks on the
    # head's GPU type, of both gangs, make its reservation; the A100 node is no use to it.
    history = History(
        "groups:\n- {count: 1, gpus: 8, gpu_type: A100}\n- {count: 1, gpus: 8, gpu_type: H100}\n",
        POLICY,
    )
    history.occupy("n0000", 8)
    for _ in range(2):
        history.occupy("n0001", 4, a_job().priority("best-effort").gpu_type("H100"))
    head = history.submit(a_job().gpus(8).gpu_type("H100").priority("production"))[0]
    history.cycle()
    history.advance(POLICY.preemption_grace_s + 1)

    history.cycle()  # both gangs are released, their ranks still run

    assert history.job(head).reason_code == "reserved_head"
    planned = history.events(ReservationPlanned, head)[-1]
    assert (planned.start_at.timestamp(), planned.nodes) == (
        history.now + POLICY.overrun_grace_s,
        ["n0001"],
    )


def test_a_head_behind_a_gang_estimated_past_any_clock_is_still_planned() -> None:
    # A recorded estimate of 1e308 s made every cycle fail: the head's planned start, a
    # timestamp, overflowed. A gang is planned to hold its GPUs a century at most.
    history = History(cluster="groups:\n  - {count: 1, gpus: 1, gpu_type: H100}\n")
    history.submit(a_job().gpus(1).estimate(1e308))
    history.run()
    head = history.submit(a_job().gpus(1))[0]
    history.run()
    why = history.deferrals(head)[-1]
    assert why.code == "reserved_head", why
    planned = history.events(ReservationPlanned)[-1].start_at.timestamp()
    assert planned == pytest.approx(T0 + MAX_PLANNED_RUNTIME_S, abs=60)


def test_a_head_behind_a_gang_being_preempted_is_planned_at_its_grace_deadline() -> None:
    """The head's plan reckons each running gang's end inline (core/reservation.py): a gang
    being preempted leaves by its grace deadline, as `estimated_end` says, not after the ten
    hours it estimated."""
    history = History("1x8")
    victim = history.submit(a_job().gpus(8).priority("best-effort").estimate(10 * HOUR))[0]
    history.run()
    history.submit(a_job().gpus(8).priority("production"))
    waiting = history.submit(a_job().gpus(8).priority("research"))[0]
    history.run(every_s=5.0)
    leaving = history.state.job_records[victim]
    assert leaving.state == "preempting"

    plans = [e for e in history.cycle() if isinstance(e, ReservationPlanned)]

    deadline = estimated_end(leaving, history.now, history.policy, history.state.estimates)
    assert history.now < deadline < history.now + HOUR
    assert [(plan.job_id, plan.start_at.timestamp()) for plan in plans] == [(waiting, deadline)]
