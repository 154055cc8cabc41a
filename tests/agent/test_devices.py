"""The devices a rank sees (DESIGN §8): MIG device UUIDs for slices, MPS limits for shares."""

from __future__ import annotations

from pathlib import Path

import pytest

from schemas.jobs import GpuShare, JobSpec, MigSlice, RankPlacement
from services.agent.devices import device_env, synthetic_mig_uuid
from services.agent.plan import rank_env


def spec(**fields: object) -> JobSpec:
    return JobSpec.model_validate({"name": "serve", "team": "nlp", **fields})


def test_a_slice_rank_sees_its_mig_device_by_a_stable_uuid() -> None:
    placement = RankPlacement(
        rank=0, node_id="n0003", gpus=[5], mig=MigSlice(profile="1g.10gb", start=2)
    )
    env = device_env(spec(mig_profile="1g.10gb"), placement)
    device = env["CUDA_VISIBLE_DEVICES"]
    assert device.startswith("MIG-") and len(device) == len("MIG-") + 36
    assert device == synthetic_mig_uuid("n0003", 5, "1g.10gb", 2)
    # Another slot of the same GPU is another device.
    assert device != synthetic_mig_uuid("n0003", 5, "1g.10gb", 3)
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in env


def test_a_real_node_passes_nvml_s_mig_uuid() -> None:
    placement = RankPlacement(
        rank=0, node_id="gpu-host", gpus=[0], mig=MigSlice(profile="3g.40gb", start=4)
    )
    real = {(0, 4): "MIG-7e2b5c38-0d0b-5a8e-9f7b-1c2d3e4f5a6b"}
    env = device_env(spec(mig_profile="3g.40gb"), placement, mig_uuids=real)
    assert env["CUDA_VISIBLE_DEVICES"] == real[(0, 4)]


def test_an_mps_share_gets_its_compute_percentage_and_memory_limit() -> None:
    placement = RankPlacement(
        rank=0,
        node_id="n0001",
        gpus=[2],
        share=GpuShare(thousandths=250, memory_mb=20_000, sharing="mps"),
    )
    env = device_env(spec(gpu_fraction=0.25, gpu_memory_mb=20_000), placement)
    assert env == {
        "CUDA_VISIBLE_DEVICES": "2",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=20000M",
    }


def test_an_mps_share_without_a_memory_ask_is_limited_to_its_fraction_of_the_gpu() -> None:
    placement = RankPlacement(rank=0, node_id="n0001", gpus=[1])
    env = device_env(spec(gpu_fraction=0.125), placement, gpu_memory_mb={1: 80_000})
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "13"
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=10000M"


def test_a_timeslice_share_and_a_whole_gpu_rank_get_their_gpus_only() -> None:
    placement = RankPlacement(rank=0, node_id="n0001", gpus=[3, 4])
    assert device_env(spec(gpus_per_task=2), placement) == {"CUDA_VISIBLE_DEVICES": "3,4"}
    share = RankPlacement(rank=0, node_id="n0001", gpus=[3])
    assert device_env(spec(gpu_fraction=0.5, sharing="timeslice"), share) == {
        "CUDA_VISIBLE_DEVICES": "3"
    }


def test_the_rank_environment_carries_the_device_variables_over_the_job_s_env(
    tmp_path: Path,
) -> None:
    job = spec(mig_profile="2g.20gb", env={"CUDA_VISIBLE_DEVICES": "0"})
    placement = RankPlacement(
        rank=0, node_id="n0000", gpus=[1], mig=MigSlice(profile="2g.20gb", start=4)
    )
    env = rank_env(
        spec=job,
        job_id="j1",
        attempt=1,
        placement=placement,
        world_size=1,
        checkpoint_dir=None,
        checkpoint_request=tmp_path / "req.json",
        agent_env={},
    )
    assert env["CUDA_VISIBLE_DEVICES"] == synthetic_mig_uuid("n0000", 1, "2g.20gb", 4)


H100_UUIDS = {
    0: "GPU-57f0c059-4aa7-8e33-d17a-8f91c82e20d2",
    1: "GPU-0b1e6a2f-3c4d-4e5f-8a9b-0c1d2e3f4a5b",
}


def test_a_real_node_names_whole_gpus_and_shares_by_uuid_as_cuda_numbers_them_otherwise() -> None:
    whole = RankPlacement(rank=0, node_id="gpu-host", gpus=[1, 0])
    env = device_env(spec(gpus_per_task=2), whole, gpu_uuids=H100_UUIDS)
    assert env == {"CUDA_VISIBLE_DEVICES": f"{H100_UUIDS[1]},{H100_UUIDS[0]}"}
    share = RankPlacement(
        rank=0,
        node_id="gpu-host",
        gpus=[1],
        share=GpuShare(thousandths=500, memory_mb=40_000, sharing="mps"),
    )
    env = device_env(spec(gpu_fraction=0.5), share, gpu_uuids=H100_UUIDS)
    assert env["CUDA_VISIBLE_DEVICES"] == H100_UUIDS[1]
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=40000M"  # device 0: the one it sees


def test_a_real_node_s_slice_keeps_its_mig_device_over_its_gpu_s_uuid() -> None:
    placement = RankPlacement(
        rank=0, node_id="gpu-host", gpus=[0], mig=MigSlice(profile="1g.10gb", start=6)
    )
    real = {(0, 6): "MIG-11111111-2222-5333-8444-555555555555"}
    env = device_env(spec(mig_profile="1g.10gb"), placement, mig_uuids=real, gpu_uuids=H100_UUIDS)
    assert env["CUDA_VISIBLE_DEVICES"] == real[(0, 6)]


def test_a_real_node_s_slice_nvml_does_not_list_is_refused_not_given_a_made_up_device() -> None:
    placement = RankPlacement(
        rank=0, node_id="gpu-host", gpus=[0], mig=MigSlice(profile="1g.10gb", start=6)
    )
    listed = {(0, 5): "MIG-11111111-2222-5333-8444-555555555555"}
    with pytest.raises(LookupError, match=r"no MIG instance 1g\.10gb at slot 6"):
        device_env(spec(mig_profile="1g.10gb"), placement, mig_uuids=listed, gpu_uuids=H100_UUIDS)
    simulated = device_env(spec(mig_profile="1g.10gb"), placement)
    assert simulated["CUDA_VISIBLE_DEVICES"] == synthetic_mig_uuid("gpu-host", 0, "1g.10gb", 6)
