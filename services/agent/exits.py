"""How a rank ended, as the kernel tells it: killed by the OOM killer, or not.

A rank the kernel's OOM killer ends dies of SIGKILL: its exit code is -9 when the killed process
is the rank's own, 137 (128 + 9) when it is a child of a shell or of the sandbox that reports
it. SIGKILL alone proves nothing (a person may send it, and so does the agent after a stop
timeout), so the agent asks the kernel too: the OOM-kill count of the rank's memory cgroup
(cgroup v2 `memory.events`, v1 `memory.oom_control`) counts only the rank's own processes;
without one (an agent that is not root), the host's count (`/proc/vmstat`) rose while the rank
ran. The host's count may also have been raised by another process at the same time: a
SIGKILL then reads as out of memory, which the retry policy forgives once at each size.
"""

from __future__ import annotations

import signal
from pathlib import Path

from services.agent import isolation

OOM_REASON = "out of memory: killed by the kernel's OOM killer"
# Died of SIGKILL: directly, or as reported by a shell or sandbox around the killed process.
SIGKILL_EXIT_CODES = frozenset({-int(signal.SIGKILL), 128 + int(signal.SIGKILL)})
HOST_VMSTAT = Path("/proc/vmstat")


def killed_for_memory(exit_code: int, oom_kills_before: int | None, oom_kills_after: int) -> bool:
    """Whether a rank that exited with `exit_code` was ended by the OOM killer: it died of
    SIGKILL while the kernel's count of OOM kills (its cgroup's, else the host's) rose."""
    if exit_code not in SIGKILL_EXIT_CODES or oom_kills_before is None:
        return False
    return oom_kills_after > oom_kills_before


def oom_kill_count(cgroup_name: str | None, cgroup_root: Path = isolation.CGROUP_ROOT) -> int:
    """The kernel's count of OOM kills in the rank's memory cgroup `cgroup_name`, or of the
    whole host where the rank has none (0 where the kernel says nothing)."""
    if cgroup_name is not None:
        for path, key in (
            (cgroup_root / "gangway" / cgroup_name / "memory.events", "oom_kill"),
            (cgroup_root / "memory" / "gangway" / cgroup_name / "memory.oom_control", "oom_kill"),
        ):
            count = _counter(path, key)
            if count is not None:
                return count
    return _counter(HOST_VMSTAT, "oom_kill") or 0


def _counter(path: Path, key: str) -> int | None:
    """The value of the `key value` line of a kernel file, None where there is none."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        name, _, value = line.partition(" ")
        if name == key and value.strip().isdigit():
            return int(value)
    return None
