"""A waiting job's recorded reason changes with the fact it states, not with the cycle's
volatile figures: the log keeps a `JobDeferred` per change a user should see, not one per
minute of a drifting estimate or per victim that leaves."""

from __future__ import annotations

import random
import re
from datetime import UTC, datetime

import pytest

from schemas.jobs import GangReserved, JobDeferred, JobRequeued, ReservationPlanned
from tests.core.builders import History, a_job


def _minute(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")


def test_a_head_whose_start_drifts_records_a_reason_only_when_its_reservation_moves() -> None:
    """The gang ahead overruns its estimate: it is planned to end `overrun_grace_s` after each
    cycle's now, so the head's planned start drifts with the clock. The reservation is
    recorded again only past `reservation_move_threshold_s`; the head's reason, which states
    its earliest start, followed every minute of the drift (one event a minute per head)."""
    history = History("1x8:1:1")
    history.submit(a_job().gpus(8).estimate(60))
    history.run()
    head = history.submit(a_job().gpus(8).estimate(600))[0]

    history.run(cycles=60, every_s=20)  # 20 minutes, the gang ahead overrunning from minute 1

    moves = history.events(ReservationPlanned, head)
    deferrals = history.deferrals(head)
    assert len(moves) >= 2, "the drift moved the reservation past its threshold"
    assert [d.code for d in deferrals] == ["reserved_head"] * len(deferrals)
    assert len(deferrals) == len(moves)
    # What the user reads is the start recorded with the reservation, on its racks.
    view = history.job(head)
    assert view.estimated_start is not None
    recorded = moves[-1].start_at
    assert (
        view.reason
        == f"needs 8 GPUs in one NVLink domain; earliest at {_minute(recorded)} on rack r000"
    )


def test_a_preemptor_records_one_reason_while_its_victims_leave_one_by_one() -> None:
    """Its reason counted the victims still checkpointing: one event per victim gone."""
    history = History("1x8:1:1")
    victims = history.submit(*(a_job().gpus(2).priority("research") for _ in range(4)))
    history.run()
    urgent = history.submit(a_job().gpus(8).priority("inference-critical"))[0]
    history.run()
    assert history.job(urgent).reason_code == "preempting"

    for victim in victims:
        history.evict(victim)
        history.run()

    assert history.job(urgent).state == "running"
    codes = [d.code for d in history.deferrals(urgent)]
    assert codes == ["preempting", "awaiting_preemption"]
    waiting = history.deferrals(urgent)[1].message
    assert waiting == (
        "needs 8 GPUs in one NVLink domain; "
        "waiting for the gangs it preempted to release their GPUs"
    )


def _churn(seed: int, cycles: int) -> History:
    """Twelve teams on 128 GPUs: jobs of 1 to 16 GPUs arrive, run past their estimates or
    not, end and are cancelled, cycles a few seconds apart."""
    rng = random.Random(seed)
    history = History("16x8:4:2")
    teams = [f"t{i}" for i in range(12)]
    for team in teams:
        history.team(team, guaranteed=8)
    ends: dict[str, float] = {}
    for _ in range(cycles):
        for _ in range(rng.choice([0, 1, 2, 3])):
            gpus = rng.choice([1, 1, 2, 4, 8, 8, 16])
            job = a_job().team(rng.choice(teams)).estimate(rng.choice([60, 300, 900]))
            history.submit(job.gpus(8).tasks(gpus // 8) if gpus > 8 else job.gpus(gpus))
        for view in list(history.state.jobs()):
            if view.state == "queued" and rng.random() < 0.01:
                history.cancel(view.job_id)
        decisions = history.cycle()
        history.stop_released(decisions)
        for event in decisions:
            if isinstance(event, GangReserved):
                history.start(event.job_id)
                ends[event.job_id] = history.now + rng.uniform(30, 1800)
        for job_id, end in list(ends.items()):
            if end <= history.now:
                if history.job(job_id).state == "running":
                    history.exit(job_id)
                del ends[job_id]
        history.advance(rng.choice([1, 5, 10, 20]))
    return history


def _figures(message: str) -> str:
    return re.sub(r"\d+", "#", message)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_under_churn_a_reason_changes_only_with_the_fact_it_states(seed: int) -> None:
    """Between two reasons of a job with the same code and the same words, something the
    log records changed the fact they state: the job's reservation moved (a
    ReservationPlanned), or it ran or was requeued in between. Never a figure alone (a
    drifting start, a count of victims still leaving)."""
    history = _churn(seed, cycles=150)

    last: dict[str, JobDeferred] = {}
    for event, _ in history.log:
        job_id = getattr(event, "job_id", None)
        if job_id is None:
            continue
        if isinstance(event, (ReservationPlanned, GangReserved, JobRequeued)):
            last.pop(job_id, None)
        elif isinstance(event, JobDeferred):
            before = last.get(job_id)
            if before is not None and before.code == event.code:
                assert _figures(before.message) != _figures(event.message), (
                    f"{job_id}: {before.message!r} then {event.message!r}"
                )
            last[job_id] = event
    assert history.auditor.violations == []
    # What a user reads is the reason the last cycle gave: each waiting job's recorded
    # reason, and a head's start is the one its reservation recorded.
    for view in history.state.jobs():
        if view.state != "queued" or view.job_id not in last:
            continue
        assert (view.reason_code, view.reason) == (
            last[view.job_id].code,
            last[view.job_id].message,
        )
        if view.reason_code == "reserved_head":
            assert view.estimated_start is not None and view.reason is not None
            when = datetime.fromtimestamp(view.estimated_start, UTC)
            assert f"earliest at {_minute(when)} on " in view.reason


def test_a_share_waiting_beside_other_teams_records_no_count_of_them() -> None:
    """Its reason counted the teams whose soft-shared GPUs have room: one event each time a
    GPU changed hands, though the fact it waits for (room on a GPU no other team shares)
    stayed the same. Which teams, and how many, is not the waiting team's business."""
    history = History(
        "groups:\n  - {count: 1, gpus: 3, gpu_type: H100, mig: none, reconfigure_s: 60}\n"
    )
    shares = {
        team: history.submit(a_job()._set(gpu_fraction=0.5, gpus_per_task=0).team(team))[0]
        for team in ("a", "b", "d")
    }
    history.run()
    waiting = history.submit(a_job()._set(gpu_fraction=0.5, gpus_per_task=0).team("c"))[0]
    history.run()
    assert history.job(waiting).reason_code == "share_other_team"

    # d's GPU is given whole to a production job of a (ahead of c in order): two teams left.
    history.exit(shares["d"])
    history.submit(a_job().gpus(1).team("a").priority("production"))
    history.run(cycles=3)

    assert history.job(waiting).state == "queued"
    reasons = history.deferrals(waiting)
    assert [r.code for r in reasons] == ["share_other_team"], [r.message for r in reasons]
    assert reasons[0].message == (
        "needs a 0.5 share of a GPU (mps); no GPU has room: the GPUs with room are "
        "each soft-shared by another team, and a soft-shared GPU hosts one team"
    )


def test_a_suspended_head_shows_no_estimated_start_and_records_its_reservation_again() -> None:
    """A suspended job is no longer the head: it kept the start and nodes of the reservation
    it held, and `why` showed that start beside 'suspended'; resumed, it was the head again
    on the stale record, no `ReservationPlanned` of its own."""
    history = History("1x8:1:1")
    history.submit(a_job().gpus(8).estimate(600))
    history.run()
    head = history.submit(a_job().gpus(8).estimate(600))[0]
    history.run()
    assert history.job(head).reason_code == "reserved_head"

    history.suspend(head)
    history.run()
    view = history.job(head)
    assert view.state == "suspended"
    assert (view.estimated_start, view.reserved_nodes) == (None, ())

    history.resume(head)
    history.run(cycles=2)  # resumed, then placed in line
    view = history.job(head)
    assert view.reason_code == "reserved_head"
    assert len(history.events(ReservationPlanned, head)) == 2
    assert view.estimated_start == history.events(ReservationPlanned, head)[-1].start_at.timestamp()
    replayed = history.replayed().job(head)
    assert replayed is not None
    assert (replayed.estimated_start, replayed.reserved_nodes) == (
        view.estimated_start,
        view.reserved_nodes,
    )
