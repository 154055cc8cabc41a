"""One rank as a real subprocess: start it, signal it, stop it (SIGTERM, then SIGKILL)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

from schemas.jobs import RankPlacement
from services.agent.isolation import Sandbox


@dataclass(frozen=True, slots=True)
class RankKey:
    job_id: str
    attempt: int
    rank: int


@dataclass
class RankProcess:
    key: RankKey
    placement: RankPlacement
    world_size: int
    process: asyncio.subprocess.Process
    workdir: Path
    started_at: float = field(default_factory=time.monotonic)
    # Why the agent stopped it (preempted, cancelled …); None while it runs on its own.
    stop_reason: str | None = None
    # The job handles SIGUSR1 by writing its own shard; otherwise the agent writes one.
    checkpoints_itself: bool = False
    # How far the agent has read the rank's step-time file.
    step_offset: int = 0
    # Started inside bubblewrap: the group's leader is bwrap itself, not the job.
    sandboxed: bool = False

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def running(self) -> bool:
        return self.process.returncode is None

    def signal(self, sig: int) -> None:
        """Signal the rank's whole process group (it runs in a session of its own), so a
        launcher script's children get it too."""
        if not self.running:
            return
        if self.sandboxed and sig != signal.SIGKILL:
            # bwrap dies of SIGTERM or SIGUSR1 and takes the sandbox with it: the job's own
            # processes get the signal, so that it may checkpoint or exit in its own time.
            for pid in _group_members(self.process.pid):
                if pid != self.process.pid:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(pid, sig)
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, sig)

    async def stop(self, reason: str, timeout_s: float) -> int:
        """SIGTERM, then SIGKILL after `timeout_s`; returns the exit code."""
        if self.stop_reason is None:
            self.stop_reason = reason
        self.signal(signal.SIGTERM)
        try:
            return await asyncio.wait_for(self.process.wait(), timeout_s)
        except TimeoutError:
            self.signal(signal.SIGKILL)
            return await self.process.wait()


async def launch(
    key: RankKey,
    placement: RankPlacement,
    world_size: int,
    argv: list[str],
    env: dict[str, str],
    workdir: Path,
    sandbox: Sandbox | None = None,
) -> RankProcess:
    """Start the rank in `workdir`, its output in `workdir/rank.log`, as `sandbox` says (its
    user, cgroups, bubblewrap). Raises OSError when the program cannot be started."""
    await asyncio.to_thread(workdir.mkdir, parents=True, exist_ok=True)
    with (workdir / "rank.log").open("ab") as log:
        process = await asyncio.create_subprocess_exec(
            *(sandbox.argv if sandbox is not None else argv),
            cwd=workdir,
            env=env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=log,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=sandbox.preexec() if sandbox is not None else None,
        )
    # Lets an agent restarted after a crash find the ranks its predecessor left behind.
    await asyncio.to_thread((workdir / PID_FILE).write_text, f"{process.pid}\n")
    rank = RankProcess(key, placement, world_size, process, workdir)
    rank.sandboxed = sandbox is not None and sandbox.sandboxed
    return rank


def _group_members(pgid: int) -> list[int]:
    """The processes of process group `pgid` (from /proc)."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid:
            members.append(int(entry.name))
    return members


PID_FILE = "rank.pid"


def stop_orphan(workdir: Path, job_id: str) -> bool:
    """Kill the rank a crashed agent left running in `workdir` (its own session, so it
    outlived the agent); True if one was found. The pid is trusted only while the process
    still carries the job's id in its environment (pids are reused)."""
    try:
        pid = int((workdir / PID_FILE).read_text().strip())
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except (OSError, ValueError):
        return False
    if f"GANGWAY_JOB_ID={job_id}".encode() not in environ:
        return False
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    return True
