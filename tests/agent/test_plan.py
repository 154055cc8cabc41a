"""The per-job controller's decisions: which ranks to start, with which environment."""

from __future__ import annotations

from pathlib import Path

from schemas.base import Event
from schemas.checkpoints import CheckpointCommitted, CheckpointShard
from schemas.jobs import (
    CheckpointSpec,
    GangReserved,
    JobCancelled,
    JobRequeued,
    JobSpec,
    JobSubmitted,
    RankPlacement,
    TaskStarted,
)
from services.agent.plan import (
    fold_job,
    latest_checkpoint,
    launch_failure,
    rank_env,
    ranks_to_launch,
)

SPEC = JobSpec(
    name="train",
    team="ml",
    tasks=2,
    gpus_per_task=4,
    command=["python", "t.py"],
    env={"LR": "0.1", "GANGWAY_RANK": "99"},
)


def gang(attempt: int = 1) -> GangReserved:
    return GangReserved(
        job_id="j1",
        attempt=attempt,
        ranks=[
            RankPlacement(rank=0, node_id="n0", gpus=[0, 1, 2, 3]),
            RankPlacement(rank=1, node_id="n1", gpus=[4, 5, 6, 7]),
        ],
    )


def history(*events: Event) -> list[Event]:
    return [JobSubmitted(job_id="j1", spec=SPEC, submitted_by="t"), *events]


def ranks(placements: list[RankPlacement]) -> list[int]:
    return [p.rank for p in placements]


def test_a_new_gang_starts_the_ranks_on_the_agents_nodes_only() -> None:
    view = fold_job(history(gang()))
    assert ranks(ranks_to_launch(view, gang(), ["n1", "n9"], set())) == [1]


def test_a_redelivered_gang_whose_ranks_started_starts_nothing() -> None:
    view = fold_job(history(gang(), TaskStarted(job_id="j1", attempt=1, rank=1, node_id="n1")))
    assert ranks_to_launch(view, gang(), ["n0", "n1"], set()) == [gang().ranks[0]]


def test_a_rank_this_agent_launched_is_not_launched_again_before_the_log_says_so() -> None:
    view = fold_job(history(gang()))
    assert ranks_to_launch(view, gang(), ["n0", "n1"], {("j1", 1, 0), ("j1", 1, 1)}) == []


def test_a_gang_released_before_delivery_starts_nothing() -> None:
    requeued = JobRequeued(job_id="j1", attempt=1, code="node_lost", reason="r")
    view = fold_job(history(gang(), requeued, gang(2)))
    assert ranks_to_launch(view, gang(1), ["n0", "n1"], set()) == []
    assert ranks(ranks_to_launch(view, gang(2), ["n0", "n1"], set())) == [0, 1]


def test_a_cancelled_job_starts_nothing() -> None:
    view = fold_job(history(gang(), JobCancelled(job_id="j1", reason="by user")))
    assert ranks_to_launch(view, gang(), ["n0", "n1"], set()) == []


def test_the_rank_environment_describes_its_placement() -> None:
    env = rank_env(
        spec=SPEC,
        job_id="j1",
        attempt=3,
        placement=gang().ranks[1],
        world_size=2,
        checkpoint_dir=Path("/ck/j1/a2-x"),
        checkpoint_request=Path("/w/req.json"),
        agent_env={"PATH": "/usr/bin", "SECRET": "agent's own"},
    )
    assert env["CUDA_VISIBLE_DEVICES"] == "4,5,6,7"
    assert (env["GANGWAY_RANK"], env["GANGWAY_WORLD_SIZE"], env["GANGWAY_ATTEMPT"]) == (
        "1",
        "2",
        "3",
    )
    assert env["GANGWAY_CHECKPOINT_DIR"] == "/ck/j1/a2-x"
    assert env["LR"] == "0.1"
    assert env["PATH"] == "/usr/bin"
    assert "SECRET" not in env


def test_a_ranks_python_output_is_unbuffered_unless_the_job_says_otherwise() -> None:
    def env_of(spec: JobSpec) -> dict[str, str]:
        return rank_env(
            spec=spec,
            job_id="j1",
            attempt=1,
            placement=gang().ranks[0],
            world_size=2,
            checkpoint_dir=None,
            checkpoint_request=Path("/w/req.json"),
            agent_env={},
        )

    assert env_of(SPEC)["PYTHONUNBUFFERED"] == "1"
    buffered = SPEC.model_copy(update={"env": {**SPEC.env, "PYTHONUNBUFFERED": ""}})
    assert env_of(buffered)["PYTHONUNBUFFERED"] == ""


def test_a_first_attempt_has_an_empty_checkpoint_dir() -> None:
    env = rank_env(
        spec=SPEC,
        job_id="j1",
        attempt=1,
        placement=gang().ranks[0],
        world_size=2,
        checkpoint_dir=None,
        checkpoint_request=Path("/w/req.json"),
        agent_env={},
    )
    assert env["GANGWAY_CHECKPOINT_DIR"] == ""


def test_the_latest_committed_checkpoint_is_the_one_to_resume_from() -> None:
    shard = CheckpointShard(rank=0, uri="file:///x", bytes=1, sha256="0" * 64)
    first = CheckpointCommitted(job_id="j1", attempt=1, checkpoint_id="a1", step=5, shards=[shard])
    second = CheckpointCommitted(job_id="j1", attempt=2, checkpoint_id="a2", step=9, shards=[shard])
    assert latest_checkpoint([first, second]) == second
    assert latest_checkpoint([]) is None


def test_the_ranks_are_told_their_checkpoint_interval() -> None:
    """The interval the gang's GangReserved records (Young-Daly's for `auto`), else the
    spec's number; empty without periodic checkpoints."""

    def interval_of(spec: JobSpec, recorded: float | None) -> str:
        return rank_env(
            spec=spec,
            job_id="j1",
            attempt=1,
            placement=gang().ranks[0],
            world_size=2,
            checkpoint_dir=None,
            checkpoint_request=Path("/w/req.json"),
            agent_env={},
            checkpoint_interval_s=recorded,
        )["GANGWAY_CHECKPOINT_INTERVAL_S"]

    auto = SPEC.model_copy(update={"checkpoint": CheckpointSpec(interval_s="auto")})
    fixed = SPEC.model_copy(update={"checkpoint": CheckpointSpec(interval_s=1800)})
    assert interval_of(auto, 2683.3) == "2683.3"
    assert interval_of(fixed, None) == "1800"
    assert interval_of(fixed, 1800.0) == "1800"
    assert interval_of(SPEC, None) == ""
    assert interval_of(auto, None) == ""  # reserved before intervals were recorded


def test_a_missing_program_is_named_in_the_launch_failure() -> None:
    # The agent raises FileNotFoundError("no such program: X") before the sandbox starts: the
    # reason said only "FileNotFoundError", never which program was missing.
    reason, permanent = launch_failure("n0000", 0, FileNotFoundError("no such program: trian"))
    assert reason == "launch failed on n0000 rank 0: no such program: trian"
    assert permanent


def test_an_exec_error_names_its_file() -> None:
    error = FileNotFoundError(2, "No such file or directory", "/opt/train")
    reason, permanent = launch_failure("n0001", 3, error)
    assert reason == "launch failed on n0001 rank 3: No such file or directory: /opt/train"
    assert permanent
