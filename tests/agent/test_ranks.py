"""Ranks are real subprocesses: their environment, their exit code, their stop."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import threading
from pathlib import Path

import pytest

from schemas.jobs import RankPlacement
from services.agent.ranks import PID_FILE, RankKey, kill_until_gone, launch, stop_orphan

PLACEMENT = RankPlacement(rank=0, node_id="n0", gpus=[2, 3])
KEY = RankKey("j1", 1, 0)


async def test_a_rank_runs_its_command_with_its_environment(tmp_path: Path) -> None:
    argv = ["sh", "-c", 'echo "rank=$GANGWAY_RANK gpus=$CUDA_VISIBLE_DEVICES"; exit 3']
    env = {"PATH": "/usr/bin:/bin", "GANGWAY_RANK": "0", "CUDA_VISIBLE_DEVICES": "2,3"}
    rank = await launch(KEY, PLACEMENT, 1, argv, env, tmp_path / "w")
    assert await rank.process.wait() == 3
    assert (tmp_path / "w" / "rank.log").read_text() == "rank=0 gpus=2,3\n"


async def test_stopping_a_rank_terminates_it(tmp_path: Path) -> None:
    rank = await launch(KEY, PLACEMENT, 1, ["sleep", "600"], {"PATH": "/usr/bin:/bin"}, tmp_path)
    code = await rank.stop("cancelled", timeout_s=30)
    assert code == -signal.SIGTERM
    assert rank.stop_reason == "cancelled"


async def test_a_rank_that_ignores_sigterm_is_killed(tmp_path: Path) -> None:
    argv = ["sh", "-c", "trap '' TERM; echo armed; while :; do sleep 0.05; done"]
    rank = await launch(KEY, PLACEMENT, 1, argv, {"PATH": "/usr/bin:/bin"}, tmp_path)
    while "armed" not in (tmp_path / "rank.log").read_text():
        assert rank.running
        await _tick()
    assert await rank.stop("preempted", timeout_s=0.3) == -signal.SIGKILL


async def test_a_missing_program_fails_to_launch(tmp_path: Path) -> None:
    with pytest.raises(OSError, match="nonexistent"):
        await launch(KEY, PLACEMENT, 1, ["/nonexistent/train"], {}, tmp_path)


async def _tick() -> None:
    await asyncio.sleep(0.05)


async def test_a_launch_follows_no_symlink_left_in_the_rank_directory(tmp_path: Path) -> None:
    # The rank owns its directory and the agent writing rank.log and rank.pid there may be
    # root (attack5): a symlink a rank left (its rank started again in the same directory)
    # (or a hard link) must not make the agent append the output to, or write the pid over,
    # another file.
    victim = tmp_path / "victim"
    victim.write_text("root's own\n")
    workdir = tmp_path / "w"
    workdir.mkdir()
    (workdir / "rank.log").symlink_to(victim)
    (workdir / "rank.pid").hardlink_to(victim)

    rank = await launch(KEY, PLACEMENT, 1, ["sh", "-c", "echo out"], {}, workdir)

    assert await rank.process.wait() == 0
    assert victim.read_text() == "root's own\n"
    assert (workdir / "rank.log").read_text() == "out\n"
    assert (workdir / "rank.pid").read_text() == f"{rank.pid}\n"


def _a_rank_of_job1() -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        ["sleep", "60"], env={**os.environ, "GANGWAY_JOB_ID": "job1"}, start_new_session=True
    )


def test_a_restarted_agent_reads_no_fifo_a_rank_left_as_its_pid_file(tmp_path: Path) -> None:
    # Seen live: a rank replaced rank.pid in its working directory by a FIFO; after a kill -9
    # of the agent, its successor blocked reading it before it was ready, and no gang of any
    # node of it was started again (jobs stayed reserved).
    rank = _a_rank_of_job1()
    fifo = tmp_path / PID_FILE
    os.mkfifo(fifo)

    def writer() -> None:  # what the rank would answer to a reader (the old, blocking read)
        with open(fifo, "w") as handle:
            handle.write(f"{rank.pid}\n")

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    try:
        assert stop_orphan(tmp_path, "job1") is None
        assert rank.poll() is None
    finally:
        unblock = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
        thread.join()
        os.close(unblock)
        rank.kill()
        rank.wait()


def test_a_restarted_agent_follows_no_symlink_a_rank_left_as_its_pid_file(tmp_path: Path) -> None:
    rank = _a_rank_of_job1()
    try:
        elsewhere = tmp_path / "elsewhere"
        elsewhere.write_text(f"{rank.pid}\n")
        workdir = tmp_path / "rank-0"
        workdir.mkdir()
        (workdir / PID_FILE).symlink_to(elsewhere)
        assert stop_orphan(workdir, "job1") is None
        assert rank.poll() is None
        (workdir / PID_FILE).unlink()
        (workdir / PID_FILE).write_text(f"{rank.pid}\n")
        assert stop_orphan(workdir, "job1") == rank.pid
        assert rank.wait() == -signal.SIGKILL
    finally:
        if rank.poll() is None:
            rank.kill()
            rank.wait()


def _process_state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


async def test_a_leftover_is_killed_until_it_no_longer_runs_before_it_counts_as_stopped() -> None:
    # A restarted agent records its predecessor's ranks as exited once it has killed them: the
    # exit hands their GPUs back, so it waits for the death, not just the signal.
    rank = _a_rank_of_job1()
    try:
        assert await kill_until_gone(lambda: {rank.pid}) is True
        # Dead, waiting for its parent (this test) to reap it.
        assert _process_state(rank.pid) in ("Z", "X")
        assert rank.wait() == -signal.SIGKILL
        assert await kill_until_gone(lambda: {rank.pid}) is False
    finally:
        if rank.poll() is None:
            rank.kill()
            rank.wait()
