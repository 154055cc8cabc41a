"""Injected hardware failures and the checkpoint interval that answers them (pure, seeded).

Two independent Poisson streams, each drawn from its own generator seeded by `--seed`, so the
same seed gives the same failures whatever the policy decides (runs stay comparable):

- node failures: every node fails at rate 1 / MTBF; the cluster-wide stream has rate
  nodes / MTBF and picks the node uniformly;
- GPU faults (an Xid that takes the GPU out): every GPU at `gpu_xid_rate` per GPU-hour; the
  stream has rate GPUs x rate and picks the GPU uniformly.

A failure that hits a node (or GPU) already down is dropped: it cannot fail twice. A failed node
comes back after `node_repair_s`, a faulty GPU after `gpu_repair_s`.

The Young-Daly interval sqrt(2 C / lambda) minimises checkpoint writing plus rework for a job
whose checkpoint takes C seconds and whose gang fails at rate lambda: the sum of its nodes'
and GPUs' failure rates. Its one definition is the core's (core/checkpointing.py), which live
jobs with `checkpoint: {interval_s: auto}` get too.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

# Re-exported: the simulator reads the core's one definition.
from core.checkpointing import young_daly_interval as young_daly_interval

HOUR_S = 3600.0


@dataclass(frozen=True, slots=True)
class FailureConfig:
    node_mtbf_h: float | None = None
    # Faults per GPU-hour that take one GPU out (an Xid 48/79-like error).
    gpu_xid_rate: float = 0.0
    seed: int = 0
    node_repair_s: float = 4 * HOUR_S
    gpu_repair_s: float = 1 * HOUR_S

    def __post_init__(self) -> None:
        if self.node_mtbf_h is not None and self.node_mtbf_h <= 0:
            raise ValueError("node MTBF must be > 0 hours")
        if self.gpu_xid_rate < 0:
            raise ValueError("the GPU fault rate must be >= 0")
        if self.node_repair_s < 0 or self.gpu_repair_s < 0:
            raise ValueError("repair times must be >= 0")

    @property
    def enabled(self) -> bool:
        return self.node_mtbf_h is not None or self.gpu_xid_rate > 0

    def gang_failure_rate(self, nodes: int, gpus: int) -> float:
        """Failures per second of a gang on `nodes` nodes holding `gpus` GPUs."""
        rate = gpus * self.gpu_xid_rate / HOUR_S
        if self.node_mtbf_h is not None:
            rate += nodes / (self.node_mtbf_h * HOUR_S)
        return rate


@dataclass(frozen=True, slots=True)
class Failure:
    at: float
    node_id: str
    gpu_index: int | None  # None: the whole node


class FailureStream:
    """One seeded Poisson stream of failures over a fixed set of targets."""

    def __init__(
        self, targets: Sequence[tuple[str, int | None]], rate_per_target_s: float, seed: int
    ) -> None:
        self._targets = list(targets)
        self._rate = rate_per_target_s * len(self._targets)
        self._rng = random.Random(seed)

    def next_after(self, now: float) -> Failure | None:
        if self._rate <= 0:
            return None
        at = now + self._rng.expovariate(self._rate)
        node_id, gpu = self._targets[self._rng.randrange(len(self._targets))]
        return Failure(at, node_id, gpu)


def failure_streams(config: FailureConfig, nodes: Sequence[tuple[str, int]]) -> list[FailureStream]:
    """The node stream and the GPU stream of a cluster of (node id, GPU count)."""
    streams: list[FailureStream] = []
    if config.node_mtbf_h is not None:
        streams.append(
            FailureStream(
                [(node_id, None) for node_id, _ in nodes],
                1.0 / (config.node_mtbf_h * HOUR_S),
                # Separate, fixed derivations of the seed: the node stream does not shift
                # when the GPU rate changes, and the other way round.
                seed=config.seed * 2,
            )
        )
    if config.gpu_xid_rate > 0:
        streams.append(
            FailureStream(
                [(node_id, index) for node_id, gpus in nodes for index in range(gpus)],
                config.gpu_xid_rate / HOUR_S,
                seed=config.seed * 2 + 1,
            )
        )
    return streams
