"""A CPU-time sampling profiler for the bench's services, where py-spy is not installed.

Python imports `sitecustomize` at start from any folder on PYTHONPATH: `bench_pipeline.py
--profile DIR` puts this folder there (with GANGWAY_SAMPLE_DIR=DIR) for the services it starts.
Then SIGUSR1 starts sampling (every 2 ms of the process's CPU time, ITIMER_PROF) and SIGUSR2
stops it and writes the stacks seen, in py-spy's raw collapsed format (`frame;frame;... count`,
outermost first), to DIR/<phase>-<pid>.txt (the phase read from DIR/phase).

Samples land on the Python frame running (or that called the C code running) when the timer
fires; only the main thread is sampled, where the services' event loops run.
"""

from __future__ import annotations

import os
import signal
from collections import Counter
from pathlib import Path
from types import FrameType

_DIR = os.environ.get("GANGWAY_SAMPLE_DIR")
_INTERVAL_S = 0.002
_stacks: Counter[tuple[str, ...]] = Counter()
_names: dict[object, str] = {}


def _name(frame: FrameType) -> str:
    code = frame.f_code
    name = _names.get(code)
    if name is None:
        path = code.co_filename
        for marker in ("site-packages/", "/lib/python3.11/", "/submit/", "/main/"):
            if marker in path:
                path = path.split(marker, 1)[1]
                break
        name = _names[code] = f"{code.co_qualname} ({path}:{code.co_firstlineno})"
    return name


def _sample(signum: int, frame: FrameType | None) -> None:
    stack = []
    while frame is not None:
        stack.append(_name(frame))
        frame = frame.f_back
    stack.reverse()
    _stacks[tuple(stack)] += 1


def _start(signum: int, frame: FrameType | None) -> None:
    _stacks.clear()
    signal.signal(signal.SIGPROF, _sample)
    signal.setitimer(signal.ITIMER_PROF, _INTERVAL_S, _INTERVAL_S)


def _stop(signum: int, frame: FrameType | None) -> None:
    signal.setitimer(signal.ITIMER_PROF, 0, 0)
    assert _DIR is not None
    folder = Path(_DIR)
    phase_file = folder / "phase"
    phase = phase_file.read_text().strip() if phase_file.exists() else "phase"
    lines = [f"{';'.join(stack)} {count}" for stack, count in _stacks.most_common()]
    (folder / f"{phase}-{os.getpid()}.txt").write_text("\n".join(lines) + "\n")


if _DIR:
    signal.signal(signal.SIGUSR1, _start)
    signal.signal(signal.SIGUSR2, _stop)
