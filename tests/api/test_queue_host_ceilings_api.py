"""A queue's CPU and memory ceilings over REST: optional `max_cpus` and `max_memory_mb` on
PUT and PATCH (a PUT without them has none, as before), shown with what the queue's gangs
hold now, and a gang whose least size could never fit under them refused at submit."""

from __future__ import annotations

from typing import Any

import pytest

from schemas.jobs import GangReserved, JobAdmitted, RankPlacement
from services.runtime import EventStore
from tests.api.builders import node
from tests.api.conftest import Api
from tests.api.test_cluster_api import eventually
from tests.api.test_queue_config_api import patch, put

pytestmark = pytest.mark.integration


async def queue_of(api: Api, name: str) -> Any:
    listed = (await api.client.get("/v1/queues", headers=api.as_admin())).json()
    return next(queue for queue in listed["items"] if queue["name"] == name)


async def test_ceilings_are_optional_shown_and_patched_field_by_field(api: Api) -> None:
    plain = await put(api, "nlp", guaranteed_gpus=0)
    assert plain.status_code == 200
    assert (plain.json()["max_cpus"], plain.json()["max_memory_mb"]) == (None, None)

    assert (await put(api, "nlp", max_cpus=64, max_memory_mb=512_000)).status_code == 200
    weighted = (await patch(api, "nlp", weight=3)).json()
    assert (weighted["max_cpus"], weighted["max_memory_mb"], weighted["weight"]) == (
        64,
        512_000,
        3.0,
    )
    cleared = (await patch(api, "nlp", max_cpus=None)).json()
    assert (cleared["max_cpus"], cleared["max_memory_mb"]) == (None, 512_000)
    assert (await patch(api, "nlp", max_cpus=-1)).status_code == 422


async def test_what_a_queues_gangs_hold_of_cpus_and_memory_adds_up_to_its_parent(
    api: Api, store: EventStore
) -> None:
    await store.append("node-n1", 0, [node("n1")])
    assert (await put(api, "org", max_cpus=32)).status_code == 200
    await api.create_team("nlp", guaranteed_gpus=0)
    assert (await put(api, "nlp", parent="org")).status_code == 200
    job_id = await api.submit(
        api.as_admin(),
        team="nlp",
        tasks=3,
        gpus_per_task=0,
        cpus_per_task=2.5,
        memory_mb_per_task=1000,
    )
    gang = GangReserved(
        job_id=job_id,
        attempt=1,
        ranks=[RankPlacement(rank=r, node_id="n1", gpus=[]) for r in range(3)],
    )
    admitted = JobAdmitted(job_id=job_id, queue="nlp", priority="research")
    await store.append(f"job-{job_id}", None, [admitted, gang])
    await eventually(
        api, "/v1/queues", lambda body: any(q["allocated_cpus"] for q in body["items"])
    )

    for name in ("nlp", "org"):
        queue = await queue_of(api, name)
        assert (queue["allocated_cpus"], queue["allocated_memory_mb"]) == (7.5, 3000)
    assert (await queue_of(api, "org"))["max_cpus"] == 32


async def test_a_gang_past_its_queues_cpu_ceiling_is_refused_at_submit(
    api: Api, store: EventStore
) -> None:
    await store.append("node-n1", 0, [node("n1")])
    await api.create_team("nlp", guaranteed_gpus=0)
    assert (await put(api, "nlp", max_cpus=8)).status_code == 200
    body = {"name": "prep", "team": "nlp", "tasks": 3, "gpus_per_task": 0, "cpus_per_task": 4}
    # The API judges capacity only once it knows a node: wait for both read models.
    await eventually(api, "/v1/nodes", lambda listed: len(listed["items"]) == 1)
    await eventually(api, "/v1/queues", lambda listed: any(q["max_cpus"] for q in listed["items"]))

    response = await api.client.post("/v1/jobs", json=body, headers=api.as_admin())

    assert response.status_code == 422
    assert response.json()["type"].endswith("over-quota-max")
    assert response.json()["detail"] == "needs 12 CPUs but queue 'nlp' may never use more than 8"
