"""A PyTorch data-parallel script as a user brings it, run by tests/e2e/test_torch_e2e.py on
the simulated fleet: torch.distributed from the environment (gloo, `env://`), an all-reduce
per step whose sum it checks, and Gangway's checkpoint protocol (SIGUSR1 → torch.save into
the shard the request file names; on resume, torch.load from GANGWAY_CHECKPOINT_DIR).

Each step all-reduces rank+1 over the world and adds the sum to a small weight tensor, so a
checkpoint at step s holds weights == s * world(world+1)/2 on every rank. It writes
report.json in its working directory once its first all-reduce of the attempt is done. A fresh
run steps until it is stopped; a resumed one takes a few more steps and exits 0.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from types import FrameType
from typing import Any

import torch
import torch.distributed as dist

STEPS_AFTER_RESUME = 3
STEP_PAUSE_S = 0.2
VARIABLES = (
    "MASTER_ADDR",
    "MASTER_PORT",
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "NODE_RANK",
    "GANGWAY_ATTEMPT",
)
checkpoint_requested = False


def on_checkpoint_signal(signum: int, frame: FrameType | None) -> None:
    global checkpoint_requested
    checkpoint_requested = True


def write_json(path: Path, value: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(value))
    os.replace(tmp, path)


def save_checkpoint(step: int, weights: torch.Tensor) -> None:
    """Where Gangway's request file says; the shard appears whole (renamed into place), since
    the agent records it as soon as it exists."""
    request = json.loads(Path(os.environ["GANGWAY_CHECKPOINT_REQUEST"]).read_text())
    shard = Path(request["shard"])
    tmp = shard.with_name(f".{shard.name}.tmp")
    torch.save({"step": step, "weights": weights.clone()}, tmp)
    os.replace(tmp, shard)


def main() -> int:
    global checkpoint_requested
    signal.signal(signal.SIGUSR1, on_checkpoint_signal)
    dist.init_process_group("gloo", init_method="env://")
    rank, world = dist.get_rank(), dist.get_world_size()
    expected = float(world * (world + 1) // 2)
    step, weights = 0, torch.zeros(4)
    resume = os.environ.get("GANGWAY_CHECKPOINT_DIR", "")
    if resume:
        state = torch.load(Path(resume) / f"rank-{rank}.bin", weights_only=True)
        step, weights = int(state["step"]), state["weights"]
    report: dict[str, Any] = {
        "env": {name: os.environ.get(name) for name in VARIABLES},
        "rank": rank,
        "world": world,
        "resumed_from_step": step if resume else None,
        "resumed_weights_ok": bool(torch.equal(weights, torch.full((4,), step * expected))),
    }
    first = step
    while True:
        total = torch.tensor([float(rank + 1)])
        dist.all_reduce(total)
        if total.item() != expected:
            print(f"all-reduce gave {total.item()}, expected {expected}", file=sys.stderr)
            return 1
        weights += total
        step += 1
        if step == first + 1:
            write_json(Path("report.json"), {**report, "all_reduce_sum": total.item()})
        if checkpoint_requested:
            checkpoint_requested = False
            save_checkpoint(step, weights)
        if resume and step >= first + STEPS_AFTER_RESUME:
            break
        time.sleep(STEP_PAUSE_S)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
