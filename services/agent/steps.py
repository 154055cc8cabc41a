"""Step times reported by the ranks: one line `STEP SECONDS` per training step, appended to
the file named by GANGWAY_STEP_FILE; the agent forwards them as StepTimeSample telemetry
(the health service's straggler rule reads them)."""

from __future__ import annotations

from pathlib import Path

from services.runtime.untrusted import open_regular

STEP_FILE = "steps"
# A rank that writes megabytes of step lines between two rounds is read in slices.
_MAX_READ = 1 << 20


def parse_steps(chunk: bytes) -> tuple[list[tuple[int, float]], int]:
    """The complete lines of `chunk` as (step, seconds), and how many bytes they took; a
    malformed line is skipped, a partial last line is left for the next read."""
    end = chunk.rfind(b"\n") + 1
    samples = []
    for line in chunk[:end].splitlines():
        parts = line.split()
        if len(parts) != 2:
            continue
        try:
            step, seconds = int(parts[0]), float(parts[1])
        except ValueError:
            continue
        if step >= 0 and 0 < seconds < float("inf"):
            samples.append((step, seconds))
    return samples, end


def read_new_steps(path: Path, offset: int) -> tuple[list[tuple[int, float]], int]:
    """The steps appended to `path` since `offset`, and the offset to read from next."""
    # The rank owns the name: only a regular file is read (never a symlink's target, nor a
    # FIFO, whose read would block the heartbeat round and so every node's heartbeat).
    try:
        handle = open_regular(path)
    except OSError:
        return [], offset
    with handle:
        handle.seek(offset)
        chunk = handle.read(_MAX_READ)
    samples, used = parse_steps(chunk)
    return samples, offset + used
