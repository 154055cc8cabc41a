"""One MPS control daemon per GPU (services/agent/mps.py), against a stand-in control program
(tests/agent/mps_standin.py): each GPU's daemon sees that GPU only and listens in a pipe
directory of its own, lives while a share of it runs, and a daemon left over by an earlier
agent is replaced. With the host's one daemon, which runs one user's server at a time, one
team's MPS share waited in CUDA's initialisation for another team's on another GPU."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from unittest.mock import patch

import pytest

from services.agent import mps
from services.agent.mps import MpsDaemonError, MpsDaemons, mps_mode
from tests.agent import mps_standin

GPU_A = "GPU-aaaaaaaa-0000-0000-0000-000000000001"
GPU_B = "GPU-bbbbbbbb-0000-0000-0000-000000000002"


@pytest.fixture
def tmp_path() -> Iterator[Path]:
    """A short directory: a daemon's sockets must fit in 107 bytes, and pytest's own
    per-test directory (/tmp/pytest-of-<user>/pytest-<n>/<test name>) takes most of them."""
    with tempfile.TemporaryDirectory(prefix="mps-") as short:
        yield Path(short)


@pytest.fixture
def record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    path = mps_standin.install(tmp_path, monkeypatch)
    yield path
    mps_standin.kill_left(path)


async def until_quit(record: Path, pid: int) -> None:
    """Until the stand-in daemon `pid` has recorded its quit (`quit` returns before)."""
    for _ in range(1500):
        if pid not in mps_standin.live(record):
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"the stand-in daemon {pid} was never quit")


async def until_gone(pid: int) -> None:
    """Until the stand-in daemon `pid` runs no more, quit or killed."""
    for _ in range(1500):
        if not mps_standin.alive(pid):
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"the stand-in daemon {pid} still runs")


async def until_started(record: Path) -> int:
    """The pid of the one stand-in daemon, once it has recorded its start."""
    for _ in range(1500):
        started = list(mps_standin.live(record))
        if started:
            [pid] = started
            return pid
        await asyncio.sleep(0.02)
    raise AssertionError("no stand-in daemon started")


async def until_event(record: Path, event: str, pid: int) -> None:
    """Until the stand-in daemon `pid` has recorded `event`."""
    for _ in range(1500):
        if any(e["event"] == event and e["pid"] == pid for e in mps_standin.events(record)):
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"the stand-in daemon {pid} never recorded {event!r}")


def daemons(tmp_path: Path, timeout_s: float = 30.0) -> MpsDaemons:
    return MpsDaemons(tmp_path / "state" / "mps", timeout_s=timeout_s)


def test_auto_runs_a_daemon_per_gpu_only_where_the_control_program_is_installed() -> None:
    assert mps_mode("auto", "/usr/bin/nvidia-cuda-mps-control") == "per-gpu"
    assert mps_mode("auto", None) == "host"
    assert mps_mode("host", "/usr/bin/nvidia-cuda-mps-control") == "host"
    assert mps_mode("per-gpu", None) == "per-gpu"


async def test_two_gpus_get_two_daemons_each_on_its_own_gpu_and_pipes(
    tmp_path: Path, record: Path
) -> None:
    running = daemons(tmp_path)
    pipe_a = await running.acquire(GPU_A, "rank-a")
    pipe_b = await running.acquire(GPU_B, "rank-b")
    assert pipe_a != pipe_b
    assert pipe_a == tmp_path / "state" / "mps" / "aaaaaaaa" / "pipe"
    assert (pipe_a / "control").exists() and (pipe_b / "control").exists()
    seen = sorted(
        (start["env"] for start in mps_standin.live(record).values()),
        key=lambda env: env["CUDA_VISIBLE_DEVICES"],
    )
    assert seen == [
        {
            "CUDA_VISIBLE_DEVICES": gpu,
            "CUDA_MPS_PIPE_DIRECTORY": str(pipe),
            "CUDA_MPS_LOG_DIRECTORY": str(pipe.parent / "log"),
        }
        for gpu, pipe in ((GPU_A, pipe_a), (GPU_B, pipe_b))
    ]
    # Passed through, never listed; the pipes and the log the daemon's user's alone.
    assert (pipe_a.parent.parent.stat().st_mode & 0o777) == 0o711
    assert (pipe_a.parent.stat().st_mode & 0o777) == 0o711
    assert (pipe_a.stat().st_mode & 0o777) == 0o700
    await running.stop_all()
    for pid in list(mps_standin.live(record)):
        await until_quit(record, pid)
    assert running.running() == []
    assert not pipe_a.exists() and not pipe_b.exists()


async def test_a_gpu_s_daemon_is_quit_after_its_last_share_and_not_before(
    tmp_path: Path, record: Path
) -> None:
    running = daemons(tmp_path)
    pipe = await running.acquire(GPU_A, "first")
    assert await running.acquire(GPU_A, "second") == pipe
    [pid] = mps_standin.live(record)  # one daemon for both shares
    await running.release(GPU_A, "first")
    await running.release(GPU_A, "first")  # twice: still the second's
    assert list(mps_standin.live(record)) == [pid]
    assert (pipe / "control").exists()
    await running.release(GPU_A, "second")
    await until_quit(record, pid)
    assert not pipe.exists()
    # The GPU's next share gets a daemon of its own.
    await running.acquire(GPU_A, "third")
    [again] = mps_standin.live(record)
    assert again != pid
    await running.stop_all()


async def test_a_daemon_left_over_by_an_earlier_agent_is_quit_and_replaced(
    tmp_path: Path, record: Path
) -> None:
    crashed = daemons(tmp_path)
    await crashed.acquire(GPU_A, "a rank of the agent that died")
    [leftover] = mps_standin.live(record)
    fresh = daemons(tmp_path)  # the next agent, knowing nothing of it
    pipe = await fresh.acquire(GPU_A, "a rank of the new agent")
    await until_quit(record, leftover)
    [replacement] = mps_standin.live(record)
    assert replacement != leftover
    assert (pipe / "control").exists()
    await fresh.stop_all()


@pytest.mark.parametrize(
    ("marker", "reason"),
    [
        ("fail", "failed (exit 1): stand-in: cannot start the MPS control daemon: no such GPU"),
        ("silent", "made no"),
    ],
)
async def test_a_daemon_that_does_not_come_up_is_an_error_with_its_reason(
    tmp_path: Path, record: Path, marker: str, reason: str
) -> None:
    await asyncio.to_thread(Path(f"{record}.{marker}").touch)
    running = daemons(tmp_path, timeout_s=0.3)
    with pytest.raises(MpsDaemonError, match=re.escape(reason)) as raised:
        await running.acquire(GPU_A, "rank")
    assert isinstance(raised.value, LookupError)  # a transient launch failure
    assert GPU_A in str(raised.value)
    assert running.running() == []
    assert not (tmp_path / "state" / "mps" / "aaaaaaaa" / "pipe").exists()


async def test_a_control_program_that_is_not_installed_is_an_error_with_its_reason(
    tmp_path: Path,
) -> None:
    running = MpsDaemons(tmp_path / "mps", control=str(tmp_path / "no-such-program"))
    with pytest.raises(MpsDaemonError, match="cannot be run"):
        await running.acquire(GPU_A, "rank")


async def test_a_daemon_serving_one_user_refuses_another_s_share(
    tmp_path: Path, record: Path
) -> None:
    running = daemons(tmp_path)
    await running.acquire(GPU_A, "team a's share", None)
    with pytest.raises(MpsDaemonError, match="another user"):
        await running.acquire(GPU_A, "team b's share", (4242, 4242))
    await running.stop_all()


def test_the_daemon_sees_none_of_the_agent_s_own_mps_variables(tmp_path: Path) -> None:
    agent_env = {"PATH": "/bin", "CUDA_MPS_PIPE_DIRECTORY": "/tmp/nvidia-mps"}
    running = MpsDaemons(tmp_path / "mps", env={**agent_env, "CUDA_VISIBLE_DEVICES": "0"})
    env = running._daemon_env(GPU_A)
    assert env["CUDA_VISIBLE_DEVICES"] == GPU_A
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == str(tmp_path / "mps" / "aaaaaaaa" / "pipe")
    assert mps.MPS_CONTROL == "nvidia-cuda-mps-control"


async def test_at_its_start_an_agent_quits_every_daemon_its_predecessor_left(
    tmp_path: Path, record: Path
) -> None:
    crashed = daemons(tmp_path)
    await crashed.acquire(GPU_A, "a rank of the agent that died")
    await crashed.acquire(GPU_B, "another")
    left = list(mps_standin.live(record))
    fresh = daemons(tmp_path)
    assert await fresh.quit_leftovers() == ["aaaaaaaa", "bbbbbbbb"]
    for pid in left:
        await until_quit(record, pid)
    assert await fresh.quit_leftovers() == []  # nothing left to quit
    assert fresh.running() == []


async def test_a_pipe_directory_too_long_for_a_socket_is_an_error_naming_the_setting(
    tmp_path: Path, record: Path
) -> None:
    deep = tmp_path / ("d" * max(1, mps.MAX_PIPE_DIRECTORY_BYTES - len(str(tmp_path))))
    running = MpsDaemons(deep)
    with pytest.raises(MpsDaemonError, match="GANGWAY_MPS_DIR"):
        await running.acquire(GPU_A, "rank")
    assert running.running() == [] and not deep.exists()
    # Where it fits, the same GPU's daemon starts.
    fitting = MpsDaemons(tmp_path / "mps")
    assert await fitting.acquire(GPU_A, "rank") == tmp_path / "mps" / "aaaaaaaa" / "pipe"
    await fitting.stop_all()


async def test_two_gpus_whose_uuids_begin_alike_get_directories_of_their_own(
    tmp_path: Path, record: Path
) -> None:
    twin = "GPU-aaaaaaaa-9999-0000-0000-000000000009"
    running = daemons(tmp_path)
    first = await running.acquire(GPU_A, "rank-a")
    second = await running.acquire(twin, "rank-twin")
    assert first.parent.name == "aaaaaaaa" and second.parent.name == twin
    assert first != second and first.exists() and second.exists()
    await running.stop_all()


async def test_quitting_leftovers_never_takes_a_daemon_being_started_for_a_leftover(
    tmp_path: Path, record: Path
) -> None:
    """`quit_leftovers` and `acquire` on one GPU, together: keyed apart (the directory's name,
    the GPU's UUID), the first took the second's starting daemon for a predecessor's and
    removed its pipe directory under it. Reconcile runs it before any share starts; one lock
    per GPU keeps that from mattering."""
    hold = Path(f"{record}.hold")
    await asyncio.to_thread(hold.touch)
    running = daemons(tmp_path)
    starting = asyncio.create_task(running.acquire(GPU_A, "rank"))
    pid = await until_started(record)
    leftovers = asyncio.create_task(running.quit_leftovers())
    # Its chance to run while the daemon starts (it waits for the start, where it should).
    await asyncio.wait({leftovers}, timeout=2.0)
    await asyncio.to_thread(hold.unlink)
    pipe = await starting
    assert await leftovers == []
    assert (pipe / "control").exists()
    assert list(mps_standin.live(record)) == [pid]
    await running.stop_all()
    await until_quit(record, pid)


async def test_a_gpu_s_next_daemon_starts_only_once_its_last_one_has_exited(
    tmp_path: Path, record: Path
) -> None:
    """A daemon told to quit exits when its MPS server has (here: never, `linger`): its pipe
    directory was removed at once and the GPU's next daemon started beside it, two daemons
    for one GPU, the old one's exit removing the new one's pipe by its path. It is waited
    for, and killed past the control timeout."""
    linger = Path(f"{record}.linger")
    await asyncio.to_thread(linger.touch)
    running = daemons(tmp_path, timeout_s=0.5)
    await running.acquire(GPU_A, "last share")
    [old] = mps_standin.live(record)
    released = asyncio.create_task(running.release(GPU_A, "last share"))
    await until_event(record, "quitting", old)  # told to quit; it lingers
    pipe = await running.acquire(GPU_A, "next share")
    await released
    await until_gone(old)  # killed: on its way out, if not yet gone
    [new] = (pid for pid in mps_standin.live(record) if mps_standin.alive(pid))
    await asyncio.to_thread(linger.unlink)
    assert (pipe / "control").exists()
    await running.release(GPU_A, "next share")
    await until_quit(record, new)


async def test_a_start_cancelled_before_its_daemon_listens_leaves_no_daemon(
    tmp_path: Path, record: Path
) -> None:
    """Cancelled while it waits for the daemon it started (the agent's task cancelled): the
    daemon, not yet the agent's, was left for ever with its GPU."""
    hold = Path(f"{record}.hold")
    await asyncio.to_thread(hold.touch)
    running = daemons(tmp_path)
    starting = asyncio.create_task(running.acquire(GPU_A, "rank"))
    pid = await until_started(record)
    starting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await starting
    await asyncio.to_thread(hold.unlink)  # it would now come up, listening for nobody
    await until_gone(pid)
    assert running.running() == []
    assert not (tmp_path / "state" / "mps" / "aaaaaaaa" / "pipe").exists()


async def test_the_agent_s_stop_quits_a_daemon_still_starting_and_starts_none_after(
    tmp_path: Path, record: Path
) -> None:
    """`stop_all` while a GPU's daemon starts: it quit only the daemons already up, and the
    starting one came up after it, listed as running with nothing left to quit it."""
    hold = Path(f"{record}.hold")
    await asyncio.to_thread(hold.touch)
    running = daemons(tmp_path)
    starting = asyncio.create_task(running.acquire(GPU_A, "rank"))
    pid = await until_started(record)
    stopping = asyncio.create_task(running.stop_all())
    await asyncio.to_thread(hold.unlink)
    await stopping
    await asyncio.gather(starting, return_exceptions=True)
    await until_gone(pid)
    assert running.running() == []
    # A share that arrives once the agent is stopping gets no daemon.
    with pytest.raises(MpsDaemonError, match="stopping"):
        await running.acquire(GPU_B, "late rank")
    assert mps_standin.live(record) == {}


async def test_the_agent_s_stop_tells_every_daemon_to_quit_at_once(
    tmp_path: Path, record: Path
) -> None:
    """One by one, a daemon slow to exit (`linger`: its server's clients) kept the next from
    being told, for up to the control timeout each, and the agent's stop is cut short after
    a few seconds (`shutdown_grace_s`): every GPU after the slow one kept its daemon."""
    running = daemons(tmp_path)
    await running.acquire(GPU_A, "rank-a")
    await running.acquire(GPU_B, "rank-b")
    pids = list(mps_standin.live(record))
    linger = Path(f"{record}.linger")
    await asyncio.to_thread(linger.touch)
    stopping = asyncio.create_task(running.stop_all())
    for pid in pids:
        await until_event(record, "quitting", pid)
    await asyncio.to_thread(linger.unlink)
    await stopping
    for pid in pids:
        await until_quit(record, pid)


async def test_a_daemon_left_by_an_agent_killed_while_it_started_is_ended_not_orphaned(
    tmp_path: Path, record: Path
) -> None:
    """The agent killed (-9) in its daemon's first moments, its successor up before the daemon
    listens: `quit` cannot reach it, and its directory was removed all the same, the one
    way any agent finds it; it then ran for good, out of reach. It is killed (its pid file)."""
    hold = Path(f"{record}.hold")
    await asyncio.to_thread(hold.touch)
    pipe = tmp_path / "state" / "mps" / "aaaaaaaa" / "pipe"
    pipe.mkdir(parents=True)
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": GPU_A, "CUDA_MPS_PIPE_DIRECTORY": str(pipe)}
    await asyncio.to_thread(
        subprocess.run, ["nvidia-cuda-mps-control", "-d"], env=env, check=True, timeout=30
    )
    pid = await until_started(record)
    assert await daemons(tmp_path).quit_leftovers() == ["aaaaaaaa"]
    await until_gone(pid)  # killed: on its way out, if not yet gone
    assert not pipe.exists()
    await asyncio.to_thread(hold.unlink)


def test_a_pid_file_the_share_team_left_as_a_fifo_or_a_symlink_is_not_read(
    tmp_path: Path,
) -> None:
    # The pipe directory is the team's (its MPS ranks bind it, as the daemon's user): a FIFO
    # in place of the pid file blocked the agent's read, in its event loop, for good.
    fifo = tmp_path / mps.PID_FILE
    os.mkfifo(fifo)

    def writer() -> None:  # what the rank would answer to a reader (the old, blocking read)
        with open(fifo, "w") as handle:
            handle.write(f"{os.getpid()}\n")

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    with patch.object(mps, "_serves", return_value=True):
        try:
            assert mps._daemon_pid(tmp_path) is None
        finally:
            unblock = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
            thread.join()
            os.close(unblock)
        fifo.unlink()
        (tmp_path / "elsewhere").write_text(f"{os.getpid()}\n")
        fifo.symlink_to(tmp_path / "elsewhere")
        assert mps._daemon_pid(tmp_path) is None
        fifo.unlink()
        fifo.write_text(f"{os.getpid()}\n")
        assert mps._daemon_pid(tmp_path) == os.getpid()
