"""/v1/nodes and /v1/cluster over nodes and gangs recorded by the other services."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from schemas.jobs import JobAdmitted
from schemas.nodes import NodeDrainRequested
from services.runtime import EventStore
from tests.api.builders import node, reserved
from tests.api.conftest import Api

pytestmark = pytest.mark.integration


async def eventually(api: Api, path: str, check: Any) -> Any:
    async with asyncio.timeout(30):
        while True:
            body = (await api.client.get(path, headers=api.as_admin())).json()
            if check(body):
                return body
            await asyncio.sleep(0.05)


async def test_cluster_totals_count_allocated_free_and_fragmented_gpus(
    api: Api, store: EventStore
) -> None:
    for node_id in ("n1", "n2"):
        await store.append(f"node-{node_id}", 0, [node(node_id)])
    job_id = await api.submit(api.as_admin(), tasks=1, gpus_per_task=4)
    await store.append(
        f"job-{job_id}",
        1,
        [
            JobAdmitted(job_id=job_id, queue="nlp", priority="research"),
            reserved(job_id, [("n1", [0, 1, 2, 3])]),
        ],
    )
    cluster = await eventually(api, "/v1/cluster", lambda body: body["allocated_gpus"] == 4)
    assert (cluster["total_gpus"], cluster["free_gpus"], cluster["whole_free_nodes"]) == (16, 12, 1)
    assert cluster["fragmentation"] == round(4 / 12, 4)


async def test_nodes_show_their_state_and_the_gangs_on_them(api: Api, store: EventStore) -> None:
    await store.append("node-n1", 0, [node("n1")])
    await store.append(
        "node-n2", 0, [node("n2"), NodeDrainRequested(node_id="n2", reason="ECC", by="health")]
    )
    job_id = await api.submit(api.as_admin(), tasks=1, gpus_per_task=2)
    await store.append(
        f"job-{job_id}",
        1,
        [
            JobAdmitted(job_id=job_id, queue="nlp", priority="research"),
            reserved(job_id, [("n1", [6, 7])]),
        ],
    )
    body = await eventually(
        api, "/v1/nodes", lambda b: len(b["items"]) == 2 and b["items"][0]["jobs"]
    )
    n1, n2 = body["items"]
    assert (n1["state"], n1["allocated_gpus"], n1["jobs"]) == ("ready", 2, {job_id: [6, 7]})
    assert (n2["state"], n2["healthy_gpus"]) == ("draining", 0)


async def test_a_node_shows_whether_nvlink_joins_its_gpus(api: Api, store: EventStore) -> None:
    await store.append("node-n1", 0, [node("n1")])
    await store.append("node-n2", 0, [node("n2").model_copy(update={"nvlink": False})])

    body = await eventually(api, "/v1/nodes", lambda b: len(b["items"]) == 2)

    assert {item["id"]: item["nvlink"] for item in body["items"]} == {"n1": True, "n2": False}


async def test_a_team_does_not_see_other_teams_jobs_on_nodes(api: Api, store: EventStore) -> None:
    nlp = await api.create_team("nlp")
    await store.append("node-n1", 0, [node("n1")])
    # The node's 8 GPUs are nlp's guarantee already: vision is guaranteed none.
    await api.create_team("vision", guaranteed_gpus=0)
    job_id = await api.submit(api.as_admin(), team="vision", tasks=1, gpus_per_task=2)
    await store.append(f"job-{job_id}", 1, [reserved(job_id, [("n1", [0, 1])])])
    await eventually(
        api, "/v1/nodes", lambda b: b["items"] and b["items"][0]["allocated_gpus"] == 2
    )
    [seen] = (await api.client.get("/v1/nodes", headers=nlp)).json()["items"]
    assert (seen["allocated_gpus"], seen["jobs"]) == (2, {})


async def test_an_operator_drains_and_undrains_a_node(api: Api, store: EventStore) -> None:
    await store.append("node-n1", 0, [node("n1")])
    response = await api.client.post(
        "/v1/nodes/n1/drain",
        json={"reason": "replacing a cable", "deadline": "2030-01-01T00:00:00Z"},
        headers=api.as_admin(),
    )
    assert response.status_code == 200, response.text
    drained = response.json()
    assert (drained["state"], drained["reason"]) == ("draining", "replacing a cable")
    [drain] = [e.payload for e in await store.read_stream("node-n1")][-1:]
    assert isinstance(drain, NodeDrainRequested) and drain.by == "admin"
    assert drain.deadline is not None and drain.deadline.year == 2030

    response = await api.client.post("/v1/nodes/n1/undrain", headers=api.as_admin())
    assert (response.status_code, response.json()["state"]) == (200, "ready")
    again = await api.client.post("/v1/nodes/n1/undrain", headers=api.as_admin())
    assert again.status_code == 409


async def test_draining_is_for_the_admin_and_for_known_nodes(api: Api, store: EventStore) -> None:
    team = await api.create_team("nlp")
    await store.append("node-n1", 0, [node("n1")])
    body = {"reason": "maintenance"}
    assert (await api.client.post("/v1/nodes/n1/drain", json=body, headers=team)).status_code == 403
    missing = await api.client.post("/v1/nodes/n9/drain", json=body, headers=api.as_admin())
    assert missing.status_code == 404
