"""One MPS control daemon per GPU, run by the agent (as NVIDIA's Kubernetes device plugin does).

An MPS control daemon runs one user's MPS server at a time: a client of another user waits
until the first user's server has exited (25.9 s on a real H100, docs/gpu-sharing.md). Ranks
run as their team's user, so with the operator's one daemon per host, team B's MPS share on
GPU 3 hung in CUDA's initialisation for as long as team A's share ran on GPU 1. Here each GPU
that hosts an MPS share gets a daemon of its own, which sees that GPU only
(`CUDA_VISIBLE_DEVICES=<its UUID>`) and listens in `<root>/<gpu>/pipe`; the ledger keeps a
soft-shared GPU to one team at a time, so one daemon never has two users' clients.

- A GPU's daemon starts (`nvidia-cuda-mps-control -d`) before its first MPS share starts and
  is quit (`quit` on the control's standard input) once its last share there has ended. Its
  directory goes, and the GPU's next daemon may start, only once it has exited (its pid file);
  one that does not take the command or exit within `timeout_s` is killed. A GPU's daemon
  starts and quits under one lock per GPU; a start cancelled, or in progress at the agent's
  stop (`stop_all`), is quit too.
- A pipe directory found at the agent's start (`quit_leftovers`) or at a daemon's start is a
  daemon left over by an agent that died: it is quit, and the directory made afresh. The
  directory is the only way an agent finds a daemon again: it is not removed while its daemon
  is known (its pid file, its environment in /proc) to run.
- The pipe and log directories belong to the user whose shares the daemon serves (their
  team's, where the agent isolates ranks), mode 0700: the MPS server, which the daemon starts
  as its client's user, makes its pipes and writes its log there, and no other team's user can
  even enter them. `<root>` and `<root>/<gpu>` are 0711, passed through, never listed.
- The control program runs in a session of its own, never waited for longer than `timeout_s`:
  a daemon that does not come up fails its share's launch (MpsDaemonError, a LookupError: a
  transient launch failure), never the agent's loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import time
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from services.runtime.untrusted import read_regular

log = logging.getLogger(__name__)

MPS_CONTROL = "nvidia-cuda-mps-control"
# What the daemon makes in its pipe directory once it listens.
CONTROL_PIPE = "control"
# Where the daemon writes its pid, in its pipe directory (NVIDIA's MPS documentation).
PID_FILE = "nvidia-cuda-mps-control.pid"
# The daemon's variables: the agent's own never reach the daemons it starts.
MPS_VARIABLES = ("CUDA_VISIBLE_DEVICES", "CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY")
POLL_S = 0.05
# What the control program said on standard error, kept in `<root>/<gpu>` for the reason.
CONTROL_ERRORS = "control.err"
# A Unix socket's path holds 107 bytes at most (sun_path, its NUL besides): the daemon and its
# servers make theirs in the pipe directory, so that path keeps room for a name of 23 bytes.
# Past it the daemon could not listen, which the agent would learn only from its timeout.
MAX_PIPE_DIRECTORY_BYTES = 107 - 24

MpsMode = Literal["per-gpu", "host"]
# The uid and gid the daemon's directories belong to; None: the agent's own.
Owner = tuple[int, int] | None


class MpsDaemonError(LookupError):
    """A GPU's MPS daemon could not be started: its share's launch fails, as a transient
    failure (the agent's `launch_failure`), with this as its reason."""


def mps_mode(setting: str, control: str | None) -> MpsMode:
    """`per-gpu` or `host` as the agent's `mps_daemon` setting says; `auto`: per GPU where the
    control program (`control`, as found on PATH) is installed, else the operator's daemon."""
    if setting in ("per-gpu", "host"):
        return setting  # type: ignore[return-value]
    return "per-gpu" if control is not None else "host"


@dataclass(frozen=True, slots=True)
class GpuDirectories:
    """Where one GPU's daemon keeps its pipes and its log."""

    root: Path

    @property
    def pipe(self) -> Path:
        return self.root / "pipe"

    @property
    def log(self) -> Path:
        return self.root / "log"


async def run_control(
    control: str,
    args: list[str],
    env: Mapping[str, str],
    *,
    stdin: bytes | None,
    timeout_s: float,
    errors: Path,
) -> int:
    """The control program's exit code; its standard error goes to `errors`. Raises
    TimeoutError (after killing it) when it has not exited within `timeout_s`, OSError when
    it cannot be run. With `-d` it forks the daemon and exits: the daemon keeps `errors`
    open, never a pipe this waits on."""
    with errors.open("wb") as stderr:
        process = await asyncio.create_subprocess_exec(
            control,
            *args,
            stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=stderr,
            env=dict(env),
            start_new_session=True,
        )
    try:
        await asyncio.wait_for(process.communicate(stdin), timeout_s)
    except BaseException:
        # Timed out, or the agent's task cancelled: in a session of its own, it would outlive
        # the agent (a `quit` to a daemon that died waits on its pipe for ever).
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        await process.wait()
        raise
    assert process.returncode is not None
    return process.returncode


class MpsDaemons:
    """The agent's per-GPU MPS control daemons and the ranks each serves."""

    def __init__(
        self,
        root: Path,
        *,
        control: str = MPS_CONTROL,
        timeout_s: float = 30.0,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.root = root
        self.control = control
        self.timeout_s = timeout_s
        base = dict(os.environ if env is None else env)
        self._env = {k: v for k, v in base.items() if k not in MPS_VARIABLES}
        # The ranks each running daemon serves, by GPU UUID, and whose its directories are.
        self._holders: dict[str, set[Hashable]] = {}
        self._owners: dict[str, Owner] = {}
        # One lock per GPU, by its directory's name: the one key that both a GPU's UUID
        # (`acquire`, `release`) and a pipe directory found on disk (`quit_leftovers`) lead to.
        self._locks: dict[str, asyncio.Lock] = {}
        # Each GPU's directory name (`_name`), by UUID.
        self._names: dict[str, str] = {}
        # Set by `stop_all`: no daemon starts after it.
        self._stopping = False

    def directories(self, uuid: str) -> GpuDirectories:
        return GpuDirectories(self.root / self._name(uuid))

    def _name(self, uuid: str) -> str:
        """The GPU's directory: its UUID's first 8 hex digits, as `nvidia-smi -L` shows them,
        or all of it where another GPU of this agent's has those. Its sockets' paths must fit
        in 107 bytes (MAX_PIPE_DIRECTORY_BYTES): the whole UUID (40 bytes) took most of it."""
        name = self._names.get(uuid)
        if name is None:
            short = uuid.removeprefix("GPU-")[:8]
            name = uuid if short in self._names.values() else short
            self._names[uuid] = name
        return name

    def running(self) -> list[str]:
        """The GPUs (UUIDs) whose daemon this agent started and has not quit."""
        return sorted(self._holders)

    def prepare(self) -> None:
        """The root of the daemons' directories, made (0711) before any rank starts: every
        rank's sandbox covers it with an empty directory, which needs it to exist."""
        self.root.mkdir(parents=True, exist_ok=True)
        self.root.chmod(0o711)

    async def acquire(self, uuid: str, holder: Hashable, owner: Owner = None) -> Path:
        """The pipe directory of GPU `uuid`'s daemon for `holder` (a rank), the daemon started
        first where none of this agent's runs; a leftover one is quit and replaced. Raises
        MpsDaemonError when it does not come up, or serves another user's shares."""
        async with self._lock(self._name(uuid)):
            if self._stopping:
                raise MpsDaemonError(f"GPU {uuid}: the agent is stopping; no MPS daemon starts")
            directories = self.directories(uuid)
            holders = self._holders.get(uuid)
            if holders is not None:
                if self._owners[uuid] != owner:
                    raise MpsDaemonError(
                        f"GPU {uuid}'s MPS daemon serves another user's shares ({len(holders)})"
                    )
                holders.add(holder)
                return directories.pipe
            if directories.pipe.exists():
                log.warning("GPU %s: quitting an MPS daemon left over by an earlier agent", uuid)
                await self._quit(directories, uuid)
            await self._start(uuid, owner)
            self._holders[uuid] = {holder}
            self._owners[uuid] = owner
            return directories.pipe

    async def release(self, uuid: str, holder: Hashable) -> None:
        """`holder` no longer uses GPU `uuid`'s daemon: the daemon is quit if it was the last."""
        async with self._lock(self._name(uuid)):
            holders = self._holders.get(uuid)
            if holders is None or holder not in holders:
                return
            holders.discard(holder)
            if holders:
                return
            del self._holders[uuid]
            del self._owners[uuid]
            await self._quit(self.directories(uuid), uuid)

    async def stop_all(self) -> None:
        """Quit every daemon this agent started (at its stop), one still starting once it is
        up (each GPU's lock waits for it: a start in progress is no share's yet, and was left
        running); none starts after."""
        self._stopping = True
        # All at once: one daemon slow to exit (its server's clients) held back the others'
        # quit, and the agent's stop is cut short (`shutdown_grace_s`) before it ends.
        await asyncio.gather(*(self._stop(uuid, name) for uuid, name in self._names.items()))

    async def _stop(self, uuid: str, name: str) -> None:
        async with self._lock(name):
            if self._holders.pop(uuid, None) is not None:
                self._owners.pop(uuid, None)
                await self._quit(self.directories(uuid), uuid)

    async def quit_leftovers(self) -> list[str]:
        """Quit the daemons an earlier agent left (their pipe directories are here, and this
        agent started none of them): at the agent's start, once its predecessor's ranks are
        stopped. Returns their directories' names."""
        try:
            found = sorted(entry.name for entry in self.root.iterdir() if entry.is_dir())
        except OSError:
            return []
        quit = []
        for name in found:
            async with self._lock(name):
                ours = {self._name(uuid) for uuid in self._holders}
                directories = GpuDirectories(self.root / name)
                if name not in ours and directories.pipe.is_dir():
                    log.warning("GPU %s: quitting an MPS daemon left by an earlier agent", name)
                    await self._quit(directories, name)
                    quit.append(name)
        return quit

    def _lock(self, name: str) -> asyncio.Lock:
        """GPU `name`'s (its directory's name) lock, held while its daemon starts or quits:
        keyed by the UUID, a pipe directory `quit_leftovers` found was quit under a start in
        progress, taken for a predecessor's since no share held it yet."""
        return self._locks.setdefault(name, asyncio.Lock())

    def _daemon_env(self, uuid: str) -> dict[str, str]:
        return self._control_env(self.directories(uuid), uuid)

    def _control_env(self, directories: GpuDirectories, gpu: str) -> dict[str, str]:
        return {
            **self._env,
            "CUDA_VISIBLE_DEVICES": gpu,
            "CUDA_MPS_PIPE_DIRECTORY": str(directories.pipe),
            "CUDA_MPS_LOG_DIRECTORY": str(directories.log),
        }

    def _make_directories(self, uuid: str, owner: Owner) -> GpuDirectories:
        self.prepare()
        directories = self.directories(uuid)
        directories.root.mkdir(exist_ok=True)
        directories.root.chmod(0o711)
        # Fresh: the last server's log was another team's.
        for directory in (directories.pipe, directories.log):
            shutil.rmtree(directory, ignore_errors=True)
            directory.mkdir()
            if owner is not None:
                os.chown(directory, *owner)
            directory.chmod(0o700)
        return directories

    async def _start(self, uuid: str, owner: Owner) -> None:
        pipe = self.directories(uuid).pipe
        if len(os.fsencode(pipe)) > MAX_PIPE_DIRECTORY_BYTES:
            raise MpsDaemonError(
                f"GPU {uuid}: the MPS daemon's pipe directory {pipe} is longer than "
                f"{MAX_PIPE_DIRECTORY_BYTES} bytes, too long for its sockets: set "
                "GANGWAY_MPS_DIR to a shorter directory"
            )
        try:
            directories = self._make_directories(uuid, owner)
        except OSError as error:
            message = f"GPU {uuid}: cannot make the MPS daemon's directories: {error}"
            raise MpsDaemonError(message) from error
        try:
            await self._run_daemon(directories, uuid)
        except asyncio.CancelledError:
            # The agent's task cancelled once `-d` ran: its daemon, up or coming up, is no
            # share's yet, so neither a release nor `stop_all` would ever quit it. Shielded: a
            # second cancel leaves the quit to finish on its own.
            await asyncio.shield(self._quit(directories, uuid))
            raise

    async def _run_daemon(self, directories: GpuDirectories, uuid: str) -> None:
        """`-d`, and its daemon's control pipe waited for."""
        errors = directories.root / CONTROL_ERRORS
        what = f"GPU {uuid}'s MPS control daemon ({self.control} -d)"
        try:
            code = await run_control(
                self.control,
                ["-d"],
                self._daemon_env(uuid),
                stdin=None,
                timeout_s=self.timeout_s,
                errors=errors,
            )
        except TimeoutError:
            await self._quit(directories, uuid)
            raise MpsDaemonError(f"{what} did not return within {self.timeout_s:g} s") from None
        except OSError as error:
            shutil.rmtree(directories.pipe, ignore_errors=True)
            raise MpsDaemonError(f"{what} cannot be run: {error}") from None
        if code != 0:
            said = _tail(errors)
            await self._quit(directories, uuid)
            raise MpsDaemonError(f"{what} failed (exit {code}){': ' + said if said else ''}")
        control = directories.pipe / CONTROL_PIPE
        deadline = time.monotonic() + self.timeout_s
        while not control.exists():
            if time.monotonic() >= deadline:
                await self._quit(directories, uuid)
                raise MpsDaemonError(
                    f"{what} made no {control} within {self.timeout_s:g} s"
                    f" (its log: {directories.log})"
                )
            await asyncio.sleep(POLL_S)
        log.info("GPU %s: MPS control daemon started (pipes in %s)", uuid, directories.pipe)

    async def _quit(self, directories: GpuDirectories, gpu: str) -> None:
        """`quit` to the daemon listening in `directories` (GPU `gpu`'s), then, once it has
        exited, its pipe directory removed (its log is kept for the operator until the GPU's
        next daemon). A daemon that does not take the command, or has not exited `timeout_s`
        after it, is killed. Never raises: what went wrong is logged.

        `quit` returns once the daemon has the command, not once it has exited (which may wait
        for its MPS server). Its directory removed at once, the GPU's next daemon started
        beside it (a share arriving meanwhile), two daemons for one GPU, the old one's server
        still on it and the old one's exit removing the new one's pipes by their paths. Its
        directory is the only way any agent finds it again: removed with the daemon alive, it
        ran for good."""
        if not directories.pipe.exists():
            return
        pid = _daemon_pid(directories.pipe)
        code: int | None = None
        try:
            code = await run_control(
                self.control,
                [],
                self._control_env(directories, gpu),
                stdin=b"quit\n",
                timeout_s=self.timeout_s,
                errors=directories.root / CONTROL_ERRORS,
            )
            if code != 0:
                log.warning(
                    "GPU %s: quitting its MPS daemon failed (exit %d): %s",
                    gpu,
                    code,
                    _tail(directories.root / CONTROL_ERRORS),
                )
        except (TimeoutError, OSError) as error:
            log.warning("GPU %s: quitting its MPS daemon failed: %r", gpu, error)
        exited = code == 0 and pid is not None and await self._exited(pid, directories.pipe)
        if pid is not None and not exited and _serves(pid, directories.pipe):
            # Not yet listening (its start cancelled), hung, or its server never ending:
            # nothing else would ever end it.
            log.warning("GPU %s: its MPS daemon (pid %d) did not exit; killed", gpu, pid)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            # A signal is delivered in its own time: gone before the GPU's next daemon starts.
            await self._exited(pid, directories.pipe)
        shutil.rmtree(directories.pipe, ignore_errors=True)
        log.info("GPU %s: MPS control daemon quit", gpu)

    async def _exited(self, pid: int, pipe: Path) -> bool:
        """Whether daemon `pid` (of pipe directory `pipe`) exits within `timeout_s`."""
        deadline = time.monotonic() + self.timeout_s
        while _serves(pid, pipe):
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(POLL_S)
        return True


def _daemon_pid(pipe: Path) -> int | None:
    """The pid in the pipe directory's pid file, where that process is its daemon."""
    # The directory is the share's team's (its ranks bind it, as the daemon's user): a FIFO
    # left as the pid file would block this read, and with it the agent's every node.
    try:
        pid = int(read_regular(pipe / PID_FILE, 64).strip())
    except (OSError, ValueError):
        return None
    return pid if _serves(pid, pipe) else None


def _serves(pid: int, pipe: Path) -> bool:
    """Whether process `pid` runs, a daemon of pipe directory `pipe`: started with it as its
    CUDA_MPS_PIPE_DIRECTORY. A pid file outlives a reboot, and its pid may be another
    process's by then; a zombie's environment reads empty."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False
    return b"CUDA_MPS_PIPE_DIRECTORY=" + os.fsencode(pipe) in environ.split(b"\0")


def _tail(path: Path, limit: int = 300) -> str:
    """The last words of a control program's standard error, on one line."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return " ".join(text.split())[-limit:]
