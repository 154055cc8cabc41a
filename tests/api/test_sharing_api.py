"""Submitting slice, share and CPU-only jobs over REST: bad combinations get a 422 problem and
nothing reaches the log; a profile no GPU model of the cluster offers is refused."""

from __future__ import annotations

import asyncio

import pytest

from services.runtime import EventStore
from tests.api.builders import node
from tests.api.conftest import Api
from tests.api.test_validation_api import rejected

pytestmark = pytest.mark.integration


@pytest.fixture
async def h100_cluster(api: Api, store: EventStore) -> None:
    await api.create_team("nlp")
    # MIG-capable (the scheduler may cut its GPUs): a slice job is refused on a fleet where
    # no node offers its profile (test_validation_api.py).
    mig = node("n1").model_copy(update={"gpu_model": "H100-80GB", "mig": "dynamic"})
    await store.append("node-n1", 0, [mig])
    async with asyncio.timeout(30):
        while True:
            if (await api.client.get("/v1/nodes", headers=api.as_admin())).json()["items"]:
                break
            await asyncio.sleep(0.05)


@pytest.mark.usefixtures("h100_cluster")
async def test_a_slice_and_a_share_job_are_accepted(api: Api) -> None:
    for body in (
        {"name": "infer", "team": "nlp", "tasks": 7, "mig_profile": "1g.10gb"},
        {"name": "nb", "team": "nlp", "gpu_fraction": 0.25, "gpu_memory_mb": 16_000},
        {"name": "dev", "team": "nlp", "gpu_fraction": 0.5, "sharing": "timeslice"},
    ):
        response = await api.client.post("/v1/jobs", json=body, headers=api.teams["nlp"])
        assert response.status_code == 201, response.text


@pytest.mark.usefixtures("h100_cluster")
@pytest.mark.parametrize(
    "body",
    [
        {"mig_profile": "1g.10gb", "gpus_per_task": 1},
        {"mig_profile": "1g.10gb", "gpu_fraction": 0.5},
        {"gpu_fraction": 1.0},
        {"gpu_fraction": 0.1234},
        {"sharing": "mps"},
        {"gpus_per_task": 0},
        # Less than a thousandth rounds to a share of nothing: a task that takes no part of
        # its GPU would pack without bound.
        {"gpu_fraction": 1e-300},
        {"gpu_fraction": 1e-9},
        # Strict JSON: a boolean is not a number of GPUs, beside a share or not.
        {"gpu_fraction": 0.5, "gpus_per_task": True},
        {"gpu_fraction": 0.5, "gpus_per_task": False},
        {"mig_profile": "1g.10gb", "gpus_per_task": True},
    ],
)
async def test_bad_combinations_are_a_validation_problem(
    api: Api, store: EventStore, body: dict[str, object]
) -> None:
    await rejected(api, store, {"name": "x", "team": "nlp", **body}, 422, "validation-error")


@pytest.mark.usefixtures("h100_cluster")
async def test_a_profile_no_gpu_model_of_the_cluster_has_is_refused(
    api: Api, store: EventStore
) -> None:
    # 1g.5gb is an A100 40GB profile; the cluster has H100s only.
    problem = await rejected(
        api,
        store,
        {"name": "x", "team": "nlp", "mig_profile": "1g.5gb"},
        422,
        "unknown-mig-profile",
    )
    assert "1g.10gb" in str(problem["detail"])
