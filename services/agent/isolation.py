"""Ranks kept apart from the control plane and from each other by the operating system.

When the agent runs as root (`make up`, CI), every team's ranks run under an unprivileged user
of their own (`gw-<team>…`, created here on first use, never uid 0), in a job working directory
and a job checkpoint directory that only that user (and root) can enter; with a cgroup per rank
(memory, CPU, pids) where the kernel lets us create one, and inside a bubblewrap sandbox (new
PID, IPC and UTS namespaces; the root file system read-only; the agent's state directory
replaced by an empty one but for the job's own directories) where `bwrap` works. Run as another
user, the agent cannot switch users: ranks run as that user, which the README states.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import pwd
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from services.runtime.untrusted import open_directory_below

log = logging.getLogger(__name__)

CGROUP_ROOT = Path("/sys/fs/cgroup")
# The launcher's directories in the state directory (gangway/launcher.py), no rank's business.
PRIVATE_STATE = ("logs", "pids")
# Every rank's process limit: a fork bomb stays inside its own cgroup.
DEFAULT_PIDS_MAX = 4096
# Where the NVIDIA driver lists its GPUs (one directory per PCI address, an `information` file).
NVIDIA_GPUS = Path("/proc/driver/nvidia/gpus")
# Where the driver says which /dev/nvidia-caps/nvidia-cap<minor> grants access to a MIG
# slice: gpu<GPU minor>/mig/gi<id>/access and gpu<GPU minor>/mig/gi<id>/ci<id>/access.
NVIDIA_CAPABILITIES = Path("/proc/driver/nvidia/capabilities")
# Where the MPS control daemon keeps its pipes unless CUDA_MPS_PIPE_DIRECTORY says otherwise.
MPS_PIPE_DIRECTORY = "/tmp/nvidia-mps"
# What every CUDA process opens besides its own GPUs' /dev/nvidiaN: the control device and
# unified memory. Not /dev/nvidia-caps: its nodes are the access capabilities of every MIG
# slice of the host (mode 0444 by default), and a slice rank holding them all could run on
# another team's slice of its GPU; a slice rank gets its own two (mig_cap_nodes).
NVIDIA_SHARED_NODES = (
    "nvidiactl",
    "nvidia-uvm",
    "nvidia-uvm-tools",
    "nvidia-modeset",
)


class IsolationError(RuntimeError):
    """The rank cannot be started isolated; the agent refuses to start it at all."""


@dataclass(frozen=True, slots=True)
class RankUser:
    name: str
    uid: int
    gid: int


@dataclass(frozen=True, slots=True)
class Limits:
    memory_bytes: int | None = None
    cpus: float | None = None
    pids: int = DEFAULT_PIDS_MAX


@dataclass(slots=True)
class Sandbox:
    """How one rank is started: its argv (wrapped in bwrap or not) and what the child does
    before exec (join its cgroups, drop to the team's user)."""

    argv: list[str]
    user: RankUser | None
    cgroup_procs: list[Path] = field(default_factory=list)
    sandboxed: bool = False

    def preexec(self) -> Callable[[], None] | None:
        if self.user is None and not self.cgroup_procs:
            return None
        procs = [str(p) for p in self.cgroup_procs]
        user = self.user

        def in_child() -> None:
            # Only async-signal-safe work here (no logging, no locks): os calls.
            for path in procs:
                try:
                    fd = os.open(path, os.O_WRONLY)
                    try:
                        os.write(fd, b"0")  # "0": the writing process itself
                    finally:
                        os.close(fd)
                except OSError:
                    pass
            if user is not None:
                os.setgroups([])
                os.setgid(user.gid)
                os.setuid(user.uid)
                if os.getuid() == 0 or os.geteuid() == 0:
                    os._exit(126)

        return in_child


def isolating(mode: str) -> bool:
    """Whether ranks get users of their own: `on`, `off`, or `auto` (when the agent is root)."""
    if mode == "on":
        return True
    if mode == "off":
        return False
    return os.geteuid() == 0


def user_name(team: str) -> str:
    """A valid Linux user name for `team`, stable, at most 32 characters, distinct per team."""
    cleaned = re.sub(r"[^a-z0-9]+", "-", team.lower()).strip("-")[:16] or "team"
    digest = hashlib.sha256(team.encode()).hexdigest()[:8]
    return f"gw-{cleaned}-{digest}"


def team_user(team: str) -> RankUser:
    """The team's unprivileged user, created (system user, no login, no home) when missing."""
    name = user_name(team)
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        useradd = shutil.which("useradd") or "/usr/sbin/useradd"
        result = subprocess.run(
            [
                useradd,
                "--system",
                "--user-group",
                "--no-create-home",
                "--shell",
                "/usr/sbin/nologin",
                "--comment",
                f"gangway ranks of team {team}"[:60],
                name,
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        # 9: created by a concurrent agent since our look-up.
        if result.returncode not in (0, 9):
            raise IsolationError(f"cannot create user {name}: {result.stderr.strip()}") from None
        entry = pwd.getpwnam(name)
    if entry.pw_uid == 0 or entry.pw_gid == 0:
        raise IsolationError(f"user {name} is privileged (uid {entry.pw_uid}); refusing")
    return RankUser(name, entry.pw_uid, entry.pw_gid)


def own_directory(path: Path, user: RankUser) -> None:
    """`path` (created if missing) belongs to `user` alone: mode 0700."""
    path.mkdir(parents=True, exist_ok=True)
    os.chown(path, user.uid, user.gid)
    path.chmod(0o700)


def directory_like_parent(path: Path, under: Path) -> None:
    """`path` (created if missing) belongs to whoever owns its parent, 0700 when that is a
    rank's user: a directory the agent makes inside a job's checkpoint directory (the one a
    rank writes its shard into on SIGUSR1) must be writable by the rank, not only by root.
    Reached from `under` (trusted) without following a symlink: the rank owns the parent,
    and one it left there would have root make and give away a directory anywhere."""
    parent = open_directory_below(under, path.parent, make=True)
    try:
        with contextlib.suppress(FileExistsError):
            os.mkdir(path.name, dir_fd=parent)
        made = os.open(path.name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=parent)
        try:
            owner = os.fstat(parent)
            if owner.st_uid != os.geteuid():
                os.fchown(made, owner.st_uid, owner.st_gid)
                os.fchmod(made, 0o700)
        finally:
            os.close(made)
    finally:
        os.close(parent)


def make_traversable(path: Path) -> None:
    """Let other users pass through (not list) every ancestor of `path`, as a rank's user
    must to reach its own directory (pytest's and mktemp's directories are 0700)."""
    for ancestor in reversed(path.resolve().parents):
        with contextlib.suppress(OSError):
            mode = ancestor.stat().st_mode
            if not mode & 0o001:
                ancestor.chmod((mode & 0o7777) | 0o001)


def hide_state(*directories: Path | None) -> None:
    """The control plane's state directory and the roots of the jobs' directories: others may
    traverse them to their own job's directory, never list them (so no tenant learns another's
    job ids); the secrets in them are 0600 (the launcher and stack.sh write them so)."""
    for directory in directories:
        if directory is None:
            continue
        with contextlib.suppress(OSError):
            directory.mkdir(parents=True, exist_ok=True)
            directory.chmod(0o711)
        # The launcher's service logs and pid files are the control plane's alone.
        for private in PRIVATE_STATE:
            with contextlib.suppress(OSError):
                (directory / private).chmod(0o700)


# ---------------------------------------------------------------------- cgroups


def cgroup_version() -> int | None:
    if (CGROUP_ROOT / "cgroup.controllers").exists():
        return 2
    if (CGROUP_ROOT / "memory").is_dir() or (CGROUP_ROOT / "pids").is_dir():
        return 1
    return None


def make_cgroup(name: str, limits: Limits) -> list[Path]:
    """Create the rank's cgroup(s) with `limits`; return the cgroup.procs files the child joins.
    Best effort: a kernel or container that refuses gives no cgroup, and says so in the log."""
    try:
        if cgroup_version() == 2:
            return [_cgroup_v2(name, limits)]
        if cgroup_version() == 1:
            return _cgroup_v1(name, limits)
    except OSError as error:
        log.warning("no cgroup for %s: %s", name, error)
    return []


def _cgroup_v2(name: str, limits: Limits) -> Path:
    parent = CGROUP_ROOT / "gangway"
    parent.mkdir(exist_ok=True)
    with contextlib.suppress(OSError):
        (CGROUP_ROOT / "cgroup.subtree_control").write_text("+memory +pids +cpu")
    with contextlib.suppress(OSError):
        (parent / "cgroup.subtree_control").write_text("+memory +pids +cpu")
    group = parent / name
    group.mkdir(exist_ok=True)
    (group / "pids.max").write_text(str(limits.pids))
    if limits.memory_bytes is not None:
        (group / "memory.max").write_text(str(limits.memory_bytes))
    if limits.cpus is not None:
        (group / "cpu.max").write_text(f"{int(limits.cpus * 100_000)} 100000")
    return group / "cgroup.procs"


def _cgroup_v1(name: str, limits: Limits) -> list[Path]:
    procs: list[Path] = []
    settings: dict[str, dict[str, str]] = {"pids": {"pids.max": str(limits.pids)}}
    if limits.memory_bytes is not None:
        settings["memory"] = {"memory.limit_in_bytes": str(limits.memory_bytes)}
    if limits.cpus is not None:
        settings["cpu"] = {
            "cpu.cfs_period_us": "100000",
            "cpu.cfs_quota_us": str(int(limits.cpus * 100_000)),
        }
    for controller, values in settings.items():
        hierarchy = CGROUP_ROOT / controller
        if not hierarchy.is_dir():
            continue
        group = hierarchy / "gangway" / name
        group.mkdir(parents=True, exist_ok=True)
        for key, value in values.items():
            (group / key).write_text(value)
        procs.append(group / "cgroup.procs")
    return procs


def _cgroup_dirs(name: str) -> list[Path]:
    return [CGROUP_ROOT / "gangway" / name] + [
        CGROUP_ROOT / c / "gangway" / name for c in ("pids", "memory", "cpu")
    ]


def cgroup_pids(name: str) -> set[int]:
    """The processes in the rank's cgroups: a process may leave its process group and its
    parent's tree (setsid after a double fork), never its cgroup, which only root may move."""
    pids: set[int] = set()
    for group in _cgroup_dirs(name):
        with contextlib.suppress(OSError, ValueError):
            pids.update(int(line) for line in (group / "cgroup.procs").read_text().split())
    return pids


def remove_cgroup(name: str) -> None:
    """Remove the rank's (empty) cgroups once it has exited."""
    for group in _cgroup_dirs(name):
        with contextlib.suppress(OSError):
            group.rmdir()


# ---------------------------------------------------------------------- bubblewrap


@cache
def gpu_minor(information: str) -> tuple[str, int] | None:
    """(UUID, device minor) from a driver's `information` file; None when it names neither."""
    fields: dict[str, str] = {}
    for line in information.splitlines():
        name, colon, value = line.partition(":")
        if colon:
            fields[name.strip()] = value.strip()
    uuid, minor = fields.get("GPU UUID"), fields.get("Device Minor")
    # isdigit() alone admits '²' (int() refuses it) and other scripts' digits.
    if not uuid or minor is None or not (minor.isascii() and minor.isdigit()):
        return None
    return uuid, int(minor)


def gpu_device_nodes(
    uuids: Sequence[str],
    *,
    mig: tuple[int, int] | None = None,
    gpus: Path = NVIDIA_GPUS,
    dev: Path = Path("/dev"),
    capabilities: Path = NVIDIA_CAPABILITIES,
) -> list[Path]:
    """The device nodes a rank on the GPUs `uuids` needs inside its sandbox, and no other GPU's:
    the driver's shared nodes and each GPU's /dev/nvidiaN (N, the minor the driver gives it,
    need not be NVML's index); for a slice rank (`mig`: its GPU instance and compute instance
    ids on its one GPU) the access capabilities of that slice and of no other.
    Raises IsolationError when the driver does not know a GPU."""
    if not uuids:
        return []  # a CPU-only rank opens no GPU device at all
    minors: dict[str, int] = {}
    for information in sorted(gpus.glob("*/information")):
        # Another GPU's unreadable or undecodable listing is no reason to fail this rank's
        # launch (a UnicodeDecodeError failed every launch on the host, as permanent).
        with contextlib.suppress(OSError, ValueError):
            found = gpu_minor(information.read_text())
            if found is not None:
                minors[found[0]] = found[1]
    unknown = [uuid for uuid in uuids if uuid not in minors]
    if unknown:
        raise IsolationError(f"the NVIDIA driver lists no GPU {unknown[0]}")
    own = [dev / f"nvidia{minors[uuid]}" for uuid in uuids]
    missing = [node for node in own if not node.exists()]
    if missing:
        # Left out, the rank started without its GPU and died of CUDA's 'no GPU', a failure
        # of the job's own rather than of the host's.
        raise IsolationError(f"GPU {uuids[own.index(missing[0])]} has no device node {missing[0]}")
    shared = [dev / name for name in NVIDIA_SHARED_NODES]
    caps = [] if mig is None else mig_cap_nodes(minors[uuids[0]], *mig, capabilities, dev)
    return [node for node in shared if node.exists()] + own + caps


def mig_cap_nodes(
    gpu_minor: int, gpu_instance: int, compute_instance: int, capabilities: Path, dev: Path
) -> list[Path]:
    """/dev/nvidia-caps/nvidia-cap<minor> of one slice's GPU instance and compute instance, as
    the driver's capability files name them (`DeviceFileMinor: <minor>`). None where the driver
    checks access through /proc rather than device nodes (nv_cap_enable_devfs=0): there is no
    node to give or withhold. Raises IsolationError when the driver lists no such slice."""
    gi = capabilities / f"gpu{gpu_minor}" / "mig" / f"gi{gpu_instance}"
    nodes = []
    for access in (gi / "access", gi / f"ci{compute_instance}" / "access"):
        try:
            text = access.read_text()
        except (OSError, ValueError) as error:
            raise IsolationError(f"the NVIDIA driver lists no MIG capability {access}") from error
        minor = _field(text, "DeviceFileMinor")
        if minor is None or not (minor.isascii() and minor.isdigit()):
            raise IsolationError(f"the NVIDIA driver's {access} names no device minor")
        nodes.append(dev / "nvidia-caps" / f"nvidia-cap{int(minor)}")
    return [node for node in nodes if node.exists()]


def _field(text: str, wanted: str) -> str | None:
    """The value of `wanted: value` in a driver's /proc text."""
    for line in text.splitlines():
        name, colon, value = line.partition(":")
        if colon and name.strip() == wanted:
            return value.strip()
    return None


def mps_pipes(env: dict[str, str], agent_env: Mapping[str, str], *, share: bool) -> list[Path]:
    """The MPS control daemon's pipe directory, for an MPS share's sandbox to bind (its private
    /tmp would hide the default one, and with it the daemon): the agent's
    CUDA_MPS_PIPE_DIRECTORY, else NVIDIA's default, where it exists. Sets the rank's variable to
    it, so the rank looks where the daemon listens.

    `share`: the ledger placed the rank as an MPS share (services/agent/devices.py
    `mps_share`). Not the rank's env: a job's own `env` may set the MPS variables, and a
    whole-GPU rank that did became a client of the daemon, which runs one user's server at a
    time: every other team's MPS shares on the host, on any GPU, queued behind it (an MPS
    client still needs its GPU's device node: on an H100 one without it found no GPU)."""
    pipes = _mps_directory(agent_env)
    if not share or pipes is None:
        return []
    env["CUDA_MPS_PIPE_DIRECTORY"] = str(pipes)
    return [pipes]


def mps_hidden(agent_env: Mapping[str, str], *, share: bool) -> list[Path]:
    """The MPS daemon's pipe directory, for any other rank's sandbox to cover with an empty
    one: outside /tmp (CUDA_MPS_PIPE_DIRECTORY=/var/run/nvidia-mps, say) the read-only root
    showed it to every rank, and a rank naming it in its own environment reached the daemon."""
    pipes = _mps_directory(agent_env)
    return [] if share or pipes is None else [pipes]


def _mps_directory(agent_env: Mapping[str, str]) -> Path | None:
    """Where the host's MPS control daemon listens (the agent's CUDA_MPS_PIPE_DIRECTORY, else
    NVIDIA's default), where it exists."""
    pipes = Path(agent_env.get("CUDA_MPS_PIPE_DIRECTORY") or MPS_PIPE_DIRECTORY)
    return pipes if pipes.is_dir() else None


def bwrap_works() -> bool:
    """Whether bubblewrap is installed and may create its namespaces here (user namespaces
    may be off, or the container may forbid them)."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return False
    probe = [
        bwrap,
        "--ro-bind",
        "/",
        "/",
        "--dev",
        "/dev",
        "--proc",
        "/proc",
        "--unshare-pid",
        "--",
        "true",
    ]
    try:
        return subprocess.run(probe, capture_output=True, timeout=10, check=False).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def bwrap_argv(
    argv: Sequence[str],
    *,
    state_dir: Path | None,
    binds: Sequence[Path],
    workdir: Path,
    keep: Sequence[Path] | None = None,
    devices: Sequence[Path] = (),
    hide: Sequence[Path] = (),
) -> list[str]:
    """`argv` inside a sandbox: its own PID/IPC/UTS namespaces (no other process is visible
    or reachable by signal), the root file system read-only, a private /tmp, and the agent's
    state directory replaced by an empty one except for `binds` (the job's own directories).
    `keep`: what of /tmp stays visible, read-only (default: the agent's installation there).
    `devices`: the host's device nodes the rank may open (its GPUs'); the sandbox's /dev holds
    only the harmless ones (null, zero, random, tty …) besides. `hide`: directories of the
    host the rank sees empty (another rank's way to the MPS daemon)."""
    bwrap = shutil.which("bwrap") or "bwrap"
    wrapped = [
        bwrap,
        "--die-with-parent",
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--ro-bind",
        "/",
        "/",
        "--dev",
        "/dev",
    ]
    for device in devices:
        wrapped += ["--dev-bind", str(device), str(device)]
    wrapped += [
        "--proc",
        "/proc",
        "--tmpfs",
        "/tmp",
    ]
    for kept in installs_under_tmp() if keep is None else keep:
        wrapped += ["--ro-bind", str(kept), str(kept)]
    if state_dir is not None:
        wrapped += ["--tmpfs", str(state_dir)]
    for hidden in hide:
        wrapped += ["--tmpfs", str(hidden)]
    for path in binds:
        wrapped += ["--bind", str(path), str(path)]
    wrapped += ["--chdir", str(workdir), "--", *argv]
    return wrapped


def installs_under_tmp(installs: Sequence[Path] | None = None) -> list[Path]:
    """What the private /tmp would hide that a rank needs to run at all: the agent's own Python
    installation (by default its prefix and interpreter) when it lives under /tmp, as a checkout
    cloned there does. Each is kept read-only as its top directory under /tmp (the checkout,
    with its editable sources); the agent's state directory inside it is still replaced by an
    empty one, and file permissions still keep the rank's uid out of the rest. Paths a job's
    command names are not kept: the rest of /tmp stays private."""
    tmp = Path("/tmp")
    candidates = installs if installs is not None else [Path(sys.prefix), Path(sys.executable)]
    kept: set[Path] = set()
    for candidate in candidates:
        parts = Path(os.path.abspath(candidate)).parts
        if len(parts) > 2 and Path(*parts[:2]) == tmp and Path(*parts[:3]).exists():
            kept.add(Path(*parts[:3]))
    return sorted(kept)


def state_dir_of(*paths: Path) -> Path | None:
    """The agent's state directory: the deepest directory holding all of `paths` (for
    `make up`, .gangway), unless that is the root."""
    common = Path(os.path.commonpath([str(p.resolve()) for p in paths]))
    return None if common == Path("/") or len(common.parts) < 3 else common
