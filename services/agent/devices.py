"""Which devices a rank sees: whole GPUs, a MIG slice's device UUID, or an MPS share's limits.

- A whole-GPU rank: `CUDA_VISIBLE_DEVICES` lists its GPU indices on a simulated node, and its
  GPUs' UUIDs (`GPU-…`) on a real one: CUDA numbers GPUs fastest first, not as NVML does, and
  inside the rank's sandbox it sees only its own GPUs, numbered from 0, so only the UUID names
  the same GPU for NVML, the scheduler and CUDA alike.
- A slice rank: `CUDA_VISIBLE_DEVICES` holds the MIG device UUID (`MIG-…`) of its GPU instance.
  On a real node the UUID is NVML's (services/runtime/mig_discovery.py), and a slice whose
  instance NVML does not list at launch fails to start (LookupError); a simulated node
  derives a stable synthetic one from (node, GPU, profile, start slot), the same on every
  launch, so that a rank and its restarts see the same device.
- An MPS share: its GPU, plus `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` (its compute share, in whole
  percent, rounded up so that a share is never starved to 0) and
  `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` (`0=<MB>M`: device 0 is the one GPU the rank sees).
  A timeslice share gets its GPU only: no isolation is what it asked for.

A placement recorded without a slice or share (the scheduler reserved a whole GPU for the
task) still gives a slice job its MIG-style device on a simulated node, at start slot 0.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Mapping

from schemas.jobs import JobSpec, RankPlacement

# Synthetic MIG device ids: uuid5 under this namespace, so they are stable and look real.
_MIG_NAMESPACE = uuid.UUID("6b1f3c52-5d0e-4b53-9d1c-2f0a3a7e9c41")

# Real MIG device UUIDs by (GPU index, start slot of the GPU instance).
MigUuids = Mapping[tuple[int, int], str]
# Real GPUs' UUIDs by index (NVML's); none for a simulated node.
GpuUuids = Mapping[int, str]


def synthetic_mig_uuid(node_id: str, gpu: int, profile: str, start: int) -> str:
    return f"MIG-{uuid.uuid5(_MIG_NAMESPACE, f'{node_id}/{gpu}/{profile}/{start}')}"


def device_env(
    spec: JobSpec,
    placement: RankPlacement,
    *,
    gpu_memory_mb: Mapping[int, int] | None = None,
    mig_uuids: MigUuids | None = None,
    gpu_uuids: GpuUuids | None = None,
) -> dict[str, str]:
    """The rank's device variables (they override anything the job's env says)."""
    gpus = ",".join(
        gpu_uuids[gpu] if gpu_uuids is not None and gpu in gpu_uuids else str(gpu)
        for gpu in placement.gpus
    )
    env = {"CUDA_VISIBLE_DEVICES": gpus}
    slot = mig_slot(spec, placement)
    if slot is not None:
        gpu, start = slot
        profile = placement.mig.profile if placement.mig is not None else spec.mig_profile
        assert profile is not None  # mig_slot says so
        if mig_uuids is None:
            env["CUDA_VISIBLE_DEVICES"] = synthetic_mig_uuid(placement.node_id, gpu, profile, start)
            return env
        # A real node: a synthetic UUID names no device CUDA knows, and the rank would start
        # only to die of 'no CUDA GPUs', a failure counted against the job.
        real = mig_uuids.get((gpu, start))
        if real is None:
            raise LookupError(
                f"GPU {gpu} holds no MIG instance {profile} at slot {start} that NVML names now"
            )
        env["CUDA_VISIBLE_DEVICES"] = real
        return env
    if not mps_share(spec, placement):
        return env
    share = placement.share
    thousandths = share.thousandths if share is not None else spec.gpu_thousandths
    memory = share.memory_mb if share is not None else spec.gpu_memory_mb
    if memory is None and gpu_memory_mb is not None and placement.gpus[0] in gpu_memory_mb:
        memory = thousandths * gpu_memory_mb[placement.gpus[0]] // 1000
    env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(max(1, math.ceil(thousandths / 10)))
    if memory is not None:
        env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"0={memory}M"
    return env


def mps_share(spec: JobSpec, placement: RankPlacement) -> bool:
    """Whether the rank is an MPS share of its GPU, as the ledger placed it: only such a rank
    reaches an MPS daemon, its GPU's own (services/agent/mps.py) or the operator's host one
    (services/agent/isolation.py `mps_pipes`). Never read from the rank's environment, which
    the job's `env` writes."""
    if placement.mig is not None or spec.mig_profile is not None or not placement.gpus:
        return False
    share = placement.share
    sharing = share.sharing if share is not None else spec.sharing
    thousandths = share.thousandths if share is not None else spec.gpu_thousandths
    return sharing == "mps" and bool(thousandths)


def mig_slot(spec: JobSpec, placement: RankPlacement) -> tuple[int, int] | None:
    """(GPU, start slot) of a slice rank's GPU instance; None for any other rank."""
    profile = placement.mig.profile if placement.mig is not None else spec.mig_profile
    if profile is None or not placement.gpus:
        return None
    return placement.gpus[0], placement.mig.start if placement.mig is not None else 0
