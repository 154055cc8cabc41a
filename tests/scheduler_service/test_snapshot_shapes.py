"""A snapshot's job shapes hash as shapes made by the process that loads it.

The scheduler pickles its state in one process and loads it in another (a restart, a
standby), whose string hashes differ. `Shape` keeps its hash and is rebuilt when unpickled
(`Shape.__reduce__`); the snapshot's pickler, which writes slotted dataclasses as their field
values, must not store that kept hash, or after a restart every per-shape answer of a cycle
(what never fits, the outcome behind the head) misses for the jobs the snapshot held.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from core.shape import shape_of
from services.scheduler.snapshots import loads

ROOT = Path(__file__).resolve().parents[2]
MADE = """
import sys
from services.scheduler.folding import Folded
from services.scheduler.snapshots import dumps
from tests.core.builders import History, a_job
history = History("groups:\\n  - {count: 1, gpus: 8, gpu_type: H100}\\n")
history.occupy("n0000", 8)
history.submit(a_job("waiting").gpus(8).gpu_type("H100").tp(8).require("rack"))
sys.stdout.buffer.write(dumps(Folded(history.state, position=1)))
"""


def test_a_snapshot_loaded_by_another_process_keeps_no_hash_of_the_one_that_pickled_it() -> None:
    blob = subprocess.run(
        [sys.executable, "-c", MADE],
        check=True,
        capture_output=True,
        cwd=ROOT,
        env={"PYTHONHASHSEED": "12345", "PATH": ""},
    ).stdout

    record = loads(blob).state.job_records["waiting"]
    assert record.spec is not None and record.shape is not None
    here = shape_of(record.spec, pcie_nodes=False)
    assert record.shape == here
    assert hash(record.shape) == hash(here)
    assert {here: "fits"}.get(record.shape) == "fits"
