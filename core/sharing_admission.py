"""Admission's rule for slices and shares: what no wait can fix for a `mig_profile` or a
`gpu_fraction` job, judged over the nodes the admission catalogue folded from NodeRegistered.

A slice job needs a node whose GPU model has the profile and whose MIG mode can offer it (mig
`dynamic`, or a fixed geometry holding it); a share job needs a GPU outside a fixed MIG
geometry with the memory it asks. A gang of slices or shares larger than the fleet could ever
hold (empty, at the most slices or shares each GPU takes), or over a ceiling of its queue chain
counted in exact fractions (seven 1g slices of an H100 count one GPU), is refused too. Without
this, such a job was admitted, then waited for ever as `unsatisfiable` (core/fractional.py
explains the same cases for jobs admitted before a fleet shrank).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Protocol

from core.mig import COMPUTE_SLICES, mig_model, pack
from core.sharing import FULL, MAX_MPS_CLIENTS_PER_GPU
from schemas.jobs import JobSpec
from schemas.reasons import RejectCode


class SharingNode(Protocol):
    """A node as this rule reads it (admission's NodeShape)."""

    @property
    def node_id(self) -> str: ...
    @property
    def gpu_type(self) -> str: ...
    @property
    def gpu_model(self) -> str | None: ...
    @property
    def mig(self) -> str: ...
    @property
    def mig_profiles(self) -> tuple[str, ...]: ...
    @property
    def gpu_memory_mb(self) -> tuple[int, ...]: ...
    @property
    def rack(self) -> str: ...
    @property
    def block(self) -> str: ...


class QueueCeiling(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def max_gpus(self) -> int | None: ...


@dataclass(frozen=True, slots=True)
class _Fit:
    node_id: str
    rack: str
    block: str
    tasks: int


def fraction_rejection(
    spec: JobSpec, nodes: Collection[SharingNode], chain: Sequence[QueueCeiling]
) -> tuple[RejectCode, str] | None:
    """Why a slice or share job could never run on this fleet, or None (also for whole-GPU
    jobs: admission's other rules judge those)."""
    if not spec.fractional:
        return None
    types = set(spec.gpu_type.split("|")) if spec.gpu_type else None
    candidates = [
        node
        for node in nodes
        if types is None or node.gpu_type in types or (node.gpu_model or "") in types
    ]
    if not candidates:
        return None  # the unknown GPU type is its own rule
    if spec.mig_profile is not None:
        fits = [
            _Fit(n.node_id, n.rack, n.block, _slices_on(n, spec.mig_profile)) for n in candidates
        ]
        if not any(fit.tasks for fit in fits):
            return (
                "mig_profile_unavailable",
                f"no node offers {spec.mig_profile} slices: no GPU model with that profile in "
                "MIG mode (mig dynamic, or a fixed geometry holding it)",
            )
        what = f"{spec.mig_profile} slices"
        amount = Fraction(int(spec.mig_profile.split("g.", 1)[0]), COMPUTE_SLICES)
    else:
        soft = [node for node in candidates if node.mig != "fixed"]
        if not soft:
            return (
                "gpu_share_unavailable",
                "every GPU of that kind has a fixed MIG geometry: none can be soft-shared",
            )
        largest = max((memory for node in soft for memory in node.gpu_memory_mb), default=0)
        if spec.gpu_memory_mb is not None and spec.gpu_memory_mb > largest:
            return (
                "gpu_memory_too_large",
                f"a share asks {spec.gpu_memory_mb} MB of GPU memory but the largest GPU that "
                f"can be soft-shared has {largest} MB",
            )
        fits = [_Fit(n.node_id, n.rack, n.block, _shares_on(n, spec)) for n in soft]
        what = f"{spec.gpu_fraction:g} GPU shares"
        amount = Fraction(spec.gpu_thousandths, FULL)
    needed = amount * spec.gang_min_tasks
    for limits in chain:
        if limits.max_gpus is not None and needed > limits.max_gpus:
            return (
                "over_quota_max",
                f"needs {float(needed):g} GPUs ({spec.gang_min_tasks} {what}) but queue "
                f"{limits.name!r} may never use more than {limits.max_gpus}",
            )
    require = spec.topology.require
    domains: dict[str, int] = {}
    for fit in fits:
        domain = {"node": fit.node_id, "rack": fit.rack, "block": fit.block}.get(require, "")
        domains[domain] = domains.get(domain, 0) + fit.tasks
    placeable = max(domains.values(), default=0)
    if placeable < spec.gang_min_tasks:
        scope = {"none": "the cluster"}.get(require, f"one {require}")
        return (
            "gang_too_large",
            f"needs {spec.gang_min_tasks} {what} but {scope} can hold at most {placeable}",
        )
    return None


def _slices_on(node: SharingNode, profile: str) -> int:
    """The most slices of the profile the node's GPUs could ever hold at once."""
    model = mig_model(node.gpu_model or node.gpu_type)
    if model is None or profile not in model.profiles:
        return 0
    gpus = len(node.gpu_memory_mb)
    if node.mig == "dynamic":
        entry = model.profiles[profile]
        per_gpu = min(entry.instance_count, len(entry.placements))
        return per_gpu * gpus
    if node.mig == "fixed":
        geometry = pack(model, node.mig_profiles) or ()
        return gpus * sum(1 for instance in geometry if instance.profile == profile)
    return 0


def _shares_on(node: SharingNode, spec: JobSpec) -> int:
    """The most shares of the job the node's GPUs could ever hold (one team, each GPU)."""
    thousandths = spec.gpu_thousandths
    total = 0
    for memory in node.gpu_memory_mb:
        per_gpu = FULL // thousandths if thousandths else 0
        if spec.sharing == "mps":
            per_gpu = min(per_gpu, MAX_MPS_CLIENTS_PER_GPU)
        share_memory = spec.gpu_memory_mb or thousandths * memory // FULL
        if share_memory:
            per_gpu = min(per_gpu, memory // share_memory)
        total += per_gpu
    return total
