"""A released gang's ranks that had not started: their agent may still start them late, so the
state names the jobs whose late start would land on given GPUs (the scheduler service guards
its appends with those jobs' streams), and forgets them once they cannot start there any more.
"""

from __future__ import annotations

from schemas.jobs import GangReserved, TaskExited, TaskStarted
from schemas.nodes import NodeLost
from tests.core.builders import History, a_job

NODE = "n0000"


def reserved_then_cancelled(history: History, job_id: str) -> list[int]:
    """A gang of 8 GPUs on one node, reserved, none of its ranks started, then cancelled."""
    history.submit(a_job(job_id).gpus(8))
    history.cycle()
    gang = history.gang(job_id)
    history.cancel(job_id)
    history.cycle()
    assert history.job(job_id).state == "cancelled"
    return gang.ranks[0].gpus


def test_a_rank_released_before_it_started_names_its_job_on_its_gpus_only() -> None:
    history = History("2x8:1:1")
    gpus = reserved_then_cancelled(history, "x")
    node = history.gang("x").ranks[0].node_id
    assert history.state.unstarted_jobs(node, gpus) == {"x"}
    assert history.state.unstarted_jobs(node, gpus[:1]) == {"x"}
    other = "n0001" if node == NODE else NODE
    assert history.state.unstarted_jobs(other, range(8)) == set()


def test_a_rank_that_started_before_its_release_lingers_instead() -> None:
    history = History("1x8:1:1")
    history.submit(a_job("x").gpus(8))
    history.cycle()
    history.start("x")
    history.cancel("x")
    history.cycle()
    assert history.state.unstarted_jobs(NODE, range(8)) == set()
    assert history.state.lingering_nodes


def test_the_late_start_moves_it_to_lingering_and_its_exit_forgets_it() -> None:
    history = History("1x8:1:1")
    reserved_then_cancelled(history, "x")
    history.start("x")  # the agent's late start, after the release
    assert history.state.unstarted_jobs(NODE, range(8)) == set()
    assert history.state.lingering_nodes == {0}
    gang = history.gang("x")
    history.record(TaskExited(job_id="x", attempt=gang.attempt, rank=0, node_id=NODE, exit_code=-9))
    assert not history.state.lingering_nodes


def test_an_exit_recorded_for_a_rank_never_started_forgets_it() -> None:
    history = History("1x8:1:1")
    reserved_then_cancelled(history, "x")
    gang = history.gang("x")
    history.record(TaskExited(job_id="x", attempt=gang.attempt, rank=0, node_id=NODE, exit_code=-1))
    assert history.state.unstarted_jobs(NODE, range(8)) == set()


def test_another_gangs_rank_started_on_those_gpus_forgets_it() -> None:
    # Bounds what is kept: once the agent has started a later gang's rank on those GPUs, the
    # released one is not started there after it.
    history = History("1x8:1:1")
    reserved_then_cancelled(history, "x")
    history.submit(a_job("y").gpus(8))
    history.cycle()
    assert history.job("y").state == "reserved"
    assert history.state.unstarted_jobs(NODE, range(8)) == {"x"}
    history.start("y")
    assert history.state.unstarted_jobs(NODE, range(8)) == set()


def test_a_lost_node_forgets_them() -> None:
    history = History("1x8:1:1")
    reserved_then_cancelled(history, "x")
    history.record(NodeLost(node_id=NODE, reason="heartbeats stopped"))
    assert history.state.unstarted_jobs(NODE, range(8)) == set()


def test_a_replay_keeps_them() -> None:
    history = History("1x8:1:1")
    reserved_then_cancelled(history, "x")
    assert history.replayed().unstarted_jobs(NODE, range(8)) == {"x"}


def test_a_late_start_recorded_before_a_new_gang_keeps_that_gang_off_its_gpus() -> None:
    # What the guard buys: a cycle that sees the late start (after its conflict) does not bind.
    history = History("1x8:1:1")
    reserved_then_cancelled(history, "x")
    gang = history.gang("x")
    history.record(TaskStarted(job_id="x", attempt=gang.attempt, rank=0, node_id=NODE))
    history.submit(a_job("y").gpus(8))
    history.cycle()
    assert history.job("y").state in ("queued", "pending")
    assert not history.auditor.violations


def test_a_gang_released_from_gpus_where_another_released_rank_lingers_frees_none_of_them() -> None:
    # attack4's storm (log positions 76909-76987): x suspended before its rank started and y
    # bound to x's GPUs in the same cycle; x's agent then started x's rank late (it lingers,
    # on y's GPUs); y cancelled, and the same cycle bound z there while x's rank ran.
    history = History("1x8:1:1")
    history.submit(a_job("x").gpus(8))
    history.cycle()
    history.submit(a_job("y").gpus(8))
    history.suspend("x")
    history.cycle()
    assert history.gang("y").ranks[0].gpus == history.gang("x").ranks[0].gpus
    history.start("x")  # the agent's late start, on GPUs now bound to y
    assert history.state.lingering_nodes == {0}
    history.submit(a_job("z").gpus(8))
    history.cancel("y")
    decisions = history.cycle()
    assert history.job("y").state == "cancelled"
    assert not [e for e in decisions if isinstance(e, GangReserved) and e.job_id == "z"]
    assert not history.auditor.violations
