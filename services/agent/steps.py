"""Step times reported by the ranks: one line `STEP SECONDS` per training step, appended to
the file named by GANGWAY_STEP_FILE; the agent forwards them as StepTimeSample telemetry
(the health service's straggler rule reads them)."""

from __future__ import annotations

import os
from pathlib import Path

from services.runtime.untrusted import open_regular

STEP_FILE = "steps"
# What a heartbeat round forwards of one rank: its newest steps, at most this many, read from
# at most the file's last _TAIL bytes; an older backlog is passed over. A rank appending a MiB
# of lines twice a second had each round parse, sign and send 262,144 samples of it, and the
# fleet's heartbeats, sent by the same rounds, fell silent. The straggler rule keeps 20 steps.
MAX_STEPS_PER_ROUND = 64
_TAIL = 4096


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
        start = max(offset, os.fstat(handle.fileno()).st_size - _TAIL)
        handle.seek(start)
        chunk = handle.read(_TAIL)
    if start > offset:
        # A backlog passed over: what precedes the first line end is the rest of a line cut.
        cut = chunk.find(b"\n") + 1
        chunk, start = chunk[cut:], start + cut
    samples, used = parse_steps(chunk)
    return samples[-MAX_STEPS_PER_ROUND:], start + used
