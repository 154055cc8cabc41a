"""One rank as a real subprocess: start it, signal it, stop it (SIGTERM, then SIGKILL); and
the variables PyTorch's launchers read, so that a training script runs on Gangway unchanged.

MASTER_PORT: every agent that runs ranks of a gang must give them the same port, and they do
not talk to each other. Each derives it from the job and the attempt (`derived_master_port`:
the job's place in a range below Linux's ephemeral ports, moved on by one per attempt, so two
attempts of a job never share it). Only rank 0's node listens on it (torch.distributed's store),
so only rank 0's agent checks it: free on the host, and not given to another live attempt of
its own. When that agent holds every rank of the gang (one node, or the simulated fleet, which
is one process) nobody else has to agree, and it moves on to the next free port; when other
agents hold ranks too it may not, and a busy port fails the attempt's launch as transient: the
next attempt derives another port. The port stays the attempt's until its ranks have exited.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hashlib
import logging
import os
import signal
import socket
import stat
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from schemas.jobs import RankPlacement
from schemas.nodes import NodeRegistered
from services.agent.disk import DiskLimit, limit_file_size
from services.agent.isolation import Sandbox
from services.runtime.untrusted import read_regular

log = logging.getLogger(__name__)

# 10000-19999: clear of the well-known ports, of Linux's ephemeral range (32768-60999), from
# which outgoing connections take theirs, and of the local stack's default ports (PostgreSQL
# 25432, Kafka 29092/29093: a rank holding one while the server restarts would keep it from
# coming back). The ports the agent's own settings name are skipped too (`infrastructure_ports`).
MASTER_PORT_FIRST = 10000
MASTER_PORT_COUNT = 10000
# What a simulated node's ranks reach rank 0's node at: the fleet runs on the agent's host.
SIMULATED_NODE_ADDRESS = "127.0.0.1"


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
    # What its working directory may hold (services/agent/disk.py); None: unbounded (tests).
    disk_limit: DiskLimit | None = None
    # Set once no process of it is left (`end_leftovers`).
    ended: bool = False

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def running(self) -> bool:
        return self.process.returncode is None

    @property
    def on_gpus(self) -> bool:
        """Whether a process of the rank may still run: its leader, or what the leader left
        until `end_leftovers` has stopped it."""
        return self.running or not self.ended

    def signal(self, sig: int) -> None:
        """Signal the rank's whole process group (it runs in a session of its own), so a
        launcher script's children get it too."""
        if not self.running:
            return
        if self.sandboxed and sig != signal.SIGKILL:
            # bwrap dies of SIGTERM or SIGUSR1 and takes the sandbox with it: the job's own
            # processes get the signal, so that it may checkpoint or exit in its own time.
            for pid in group_members(self.process.pid):
                if pid != self.process.pid:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(pid, sig)
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, sig)

    async def end_leftovers(
        self, timeout_s: float, also: Callable[[], Collection[int]] = tuple
    ) -> None:
        """Once the leader has exited: stop what it left running (a worker it started in the
        background, a child that ignored the stop's SIGTERM; `also`: the rank's processes that
        left its group, from its cgroup), SIGTERM then SIGKILL after `timeout_s`, and return
        only when none is left (or after LEFTOVER_KILL_WAIT_S more), so that the rank's
        recorded exit never hands back GPUs a process of it still uses."""

        def left() -> set[int]:
            found = {*also()} - {os.getpid()}
            try:
                os.killpg(self.process.pid, 0)
            except ProcessLookupError:
                return found  # the usual end: its group is empty, no need to read /proc
            except PermissionError:
                pass  # members of another user's: there are some
            return found | set(group_members(self.process.pid))

        pids = await asyncio.to_thread(left)
        termed: set[int] = set()
        deadline = time.monotonic() + timeout_s
        while pids:
            now = time.monotonic()
            if now >= deadline + LEFTOVER_KILL_WAIT_S:
                log.warning("%s: processes %s outlived SIGKILL", self.key, sorted(pids))
                break
            killing = now >= deadline
            for pid in pids if killing else pids - termed:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL if killing else signal.SIGTERM)
            termed |= pids
            await asyncio.sleep(0.05)
            pids = await asyncio.to_thread(left)
        self.ended = True

    async def kill(self, reason: str) -> int:
        """SIGKILL at once (no grace: a rank past its disk limit writes on meanwhile, and one
        that exits 0 on SIGTERM would pass for done); returns the exit code."""
        if self.stop_reason is None:
            self.stop_reason = reason
        self.signal(signal.SIGKILL)
        return await self.process.wait()

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
    disk_limit: DiskLimit | None = None,
) -> RankProcess:
    """Start the rank in `workdir`, its output in `workdir/rank.log`, as `sandbox` says (its
    user, cgroups, bubblewrap), no file of it larger than `disk_limit`. Raises OSError when
    the program cannot be started."""
    await asyncio.to_thread(workdir.mkdir, parents=True, exist_ok=True)
    isolate = sandbox.preexec() if sandbox is not None else None

    def in_child() -> None:
        if disk_limit is not None:
            limit_file_size(disk_limit)
        if isolate is not None:
            isolate()

    log_fd = await asyncio.to_thread(own_file, workdir / "rank.log", os.O_WRONLY | os.O_APPEND)
    with os.fdopen(log_fd, "ab") as log:
        process = await asyncio.create_subprocess_exec(
            *(sandbox.argv if sandbox is not None else argv),
            cwd=workdir,
            env=env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=log,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=in_child if disk_limit is not None or isolate is not None else None,
        )
    # Lets an agent restarted after a crash find the ranks its predecessor left behind.
    await asyncio.to_thread(_write_pid, workdir / PID_FILE, process.pid)
    rank = RankProcess(key, placement, world_size, process, workdir, disk_limit=disk_limit)
    rank.sandboxed = sandbox is not None and sandbox.sandboxed
    return rank


def own_file(path: Path, flags: int) -> int:
    """A descriptor on a regular file at `path` (made if missing), opened as `flags` say
    without following anything a rank left there: the rank owns the directory and the agent
    may be root, so a symlink, a FIFO or any other non-regular file there is removed and a
    fresh file made in its place (as is a second name of another file: a hard link)."""
    try:
        fd = os.open(path, flags | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
    except OSError as error:
        if error.errno not in (errno.ELOOP, errno.ENXIO):  # a symlink; a FIFO with no reader
            raise
    else:
        found = os.fstat(fd)
        if stat.S_ISREG(found.st_mode) and found.st_nlink == 1:
            os.set_blocking(fd, True)
            return fd
        os.close(fd)
    path.unlink()
    return os.open(path, flags | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)


def _write_pid(path: Path, pid: int) -> None:
    # Emptied once judged its own (O_TRUNC at the open would empty a hard link's file).
    fd = own_file(path, os.O_WRONLY)
    os.ftruncate(fd, 0)
    with os.fdopen(fd, "w") as handle:
        handle.write(f"{pid}\n")


def group_members(pgid: int) -> list[int]:
    """The live processes of process group `pgid` (from /proc): a zombie, which only waits for
    its parent (or init) to reap it, runs nothing and holds no GPU."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] not in _DEAD_STATES:
            members.append(int(entry.name))
    return members


PID_FILE = "rank.pid"
# /proc states of a process that has exited (zombie, dead).
_DEAD_STATES = ("Z", "X")
# After the SIGKILL, how long a leftover process of a rank may take to be gone.
LEFTOVER_KILL_WAIT_S = 5.0


def stop_orphan(workdir: Path, job_id: str) -> int | None:
    """Kill the rank a crashed agent left running in `workdir` (its own session, so it
    outlived the agent); its process group if one was found (`kill_until_gone` then waits
    for it). The pid is trusted only while the process still carries the job's id in its
    environment (pids are reused)."""
    try:
        # rank.pid lies in the directory the rank owns: no FIFO (a read that never ends: the
        # restarted agent, every node of it, hung before it was ready) nor symlink is read.
        pid = int(read_regular(workdir / PID_FILE, 64).strip())
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except (OSError, ValueError):
        return None
    if f"GANGWAY_JOB_ID={job_id}".encode() not in environ:
        return None
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    return pid


def unrecorded_ranks(
    work_dir: Path, nodes: Collection[str], known: Collection[tuple[str, int, int]]
) -> dict[int, tuple[str, int, int]]:
    """Rank processes still running from `work_dir` on one of `nodes` that are not among
    `known` (job, attempt, rank), by process group: a crashed agent started them but died
    before their TaskStarted reached the log (even before their pid file was written, and
    before bubblewrap's --die-with-parent took hold), so the log knows nothing of them and
    nothing else would ever stop them. Found in /proc by the variables the agent gave them."""
    found: dict[int, tuple[str, int, int]] = {}
    prefix = f"{work_dir}/".encode()
    own_group = os.getpgrp()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            raw = (entry / "environ").read_bytes()
            if b"GANGWAY_JOB_ID=" not in raw:
                continue
            pgid = os.getpgid(int(entry.name))
        except (OSError, ValueError):
            continue
        env = dict(item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
        try:
            key = (
                env[b"GANGWAY_JOB_ID"].decode(),
                int(env[b"GANGWAY_ATTEMPT"]),
                int(env[b"GANGWAY_RANK"]),
            )
            node = env[b"GANGWAY_NODE_ID"].decode()
        except (KeyError, ValueError, UnicodeDecodeError):
            continue
        if (
            node in nodes
            and env.get(b"GANGWAY_CHECKPOINT_REQUEST", b"").startswith(prefix)
            and key not in known
            and pgid not in (own_group, 0, 1)
        ):
            found[pgid] = key
    return found


async def kill_until_gone(processes: Callable[[], Collection[int]]) -> bool:
    """SIGKILL what `processes()` names, again at each look, until none runs (a zombie, which
    only waits for its reaper, holds no GPU) or LEFTOVER_KILL_WAIT_S have passed; whether one
    ran. A SIGKILL is not yet a death (a process inside a driver call dies when the call
    returns): a restarted agent that recorded its predecessor's rank as stopped the moment it
    signalled it handed the scheduler GPUs the rank still used."""
    deadline = time.monotonic() + LEFTOVER_KILL_WAIT_S
    running = await asyncio.to_thread(_running, processes)
    found = bool(running)
    while running:
        for pid in running:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        if time.monotonic() >= deadline:
            log.warning("processes %s outlived SIGKILL", sorted(running))
            break
        await asyncio.sleep(0.05)
        running = await asyncio.to_thread(_running, processes)
    return found


def _running(processes: Callable[[], Collection[int]]) -> set[int]:
    running = set()
    for pid in processes():
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state not in _DEAD_STATES and pid != os.getpid():
            running.add(pid)
    return running


# ---------------------------------------------------------------------- distributed environment


def node_address(node: NodeRegistered) -> str:
    """Where other nodes' ranks reach this node: its host name for a real node (as NVML
    discovery registered it), loopback for a node of the simulated fleet."""
    return SIMULATED_NODE_ADDRESS if node.discovered_by == "spec" else node.hostname


def distributed_env(
    gang: Sequence[RankPlacement], rank: int, master_addr: str, master_port: int
) -> dict[str, str]:
    """The variables torchrun, torch.distributed (`init_method="env://"`) and DeepSpeed read,
    for rank `rank` of `gang`. Nodes are numbered in the order of their lowest rank, and a
    node's ranks in rank order, as torchrun numbers them."""
    by_rank = sorted(gang, key=lambda placement: placement.rank)
    nodes = list(dict.fromkeys(placement.node_id for placement in by_rank))
    mine = next(placement for placement in by_rank if placement.rank == rank)
    local = [placement.rank for placement in by_rank if placement.node_id == mine.node_id]
    return {
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(master_port),
        "RANK": str(rank),
        "WORLD_SIZE": str(len(by_rank)),
        "LOCAL_RANK": str(local.index(rank)),
        "LOCAL_WORLD_SIZE": str(len(local)),
        "NODE_RANK": str(nodes.index(mine.node_id)),
    }


def derived_master_port(job_id: str, attempt: int, avoid: Collection[int] = ()) -> int:
    """The port every agent derives for `attempt` of the job (see the module's docstring),
    moved on past the ports in `avoid` (every agent of an installation avoids the same)."""
    digest = hashlib.blake2b(job_id.encode(), digest_size=4).digest()
    start = (int.from_bytes(digest, "big") + attempt) % MASTER_PORT_COUNT
    for offset in range(MASTER_PORT_COUNT):
        port = MASTER_PORT_FIRST + (start + offset) % MASTER_PORT_COUNT
        if port not in avoid:
            return port
    raise ValueError("every MASTER_PORT is avoided")


def infrastructure_ports(*addresses: str) -> frozenset[int]:
    """The ports named by service addresses (URLs, DSNs, `host:port` lists): a rank must not
    hold one of them while its server restarts."""
    ports: set[int] = set()
    for address in addresses:
        for part in address.split(","):
            text = part.strip()
            if not text:
                continue
            if "://" not in text:
                text = "//" + text
            with contextlib.suppress(ValueError):
                port = urlsplit(text).port
                if port is not None:
                    ports.add(port)
    return frozenset(ports)


def port_bindable(port: int) -> bool:
    """Whether a server could listen on `port` on every address of this host now (as
    torch.distributed's store does, with SO_REUSEADDR)."""
    for family, host in ((socket.AF_INET, "0.0.0.0"), (socket.AF_INET6, "::")):
        try:
            probe = socket.socket(family, socket.SOCK_STREAM)
        except OSError:
            continue  # no IPv6 on this host
        with probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind((host, port))
            except OSError as error:
                if error.errno == errno.EADDRINUSE:
                    return False
    return True


class MasterPortBusy(OSError):
    """Rank 0's port of a gang shared with other agents is taken: the launch fails, as
    transient (the next attempt derives another port)."""


@dataclass
class MasterPorts:
    """The MASTER_PORTs this agent holds for the attempts whose rank 0 runs on its nodes."""

    bindable: Callable[[int], bool] = port_bindable
    held: dict[tuple[str, int], int] = field(default_factory=dict)
    # Ports of the installation's own servers (`infrastructure_ports`), never given to a rank.
    avoid: frozenset[int] = frozenset()

    def reserve(self, job_id: str, attempt: int, *, whole_gang: bool) -> int:
        """The attempt's port (the same on every call until released). `whole_gang`: this
        agent runs every rank, so it may move past a busy derived port."""
        key = (job_id, attempt)
        if key in self.held:
            return self.held[key]
        start = derived_master_port(job_id, attempt, self.avoid)
        in_use = set(self.held.values())
        for offset in range(MASTER_PORT_COUNT if whole_gang else 1):
            port = MASTER_PORT_FIRST + (start - MASTER_PORT_FIRST + offset) % MASTER_PORT_COUNT
            if port not in in_use and port not in self.avoid and self.bindable(port):
                self.held[key] = port
                return port
        raise MasterPortBusy(
            errno.EADDRINUSE, f"MASTER_PORT {start} of attempt {attempt} is in use on rank 0's node"
        )

    def release(self, job_id: str, attempt: int) -> None:
        self.held.pop((job_id, attempt), None)
