"""Queue configuration is checked before it is written, PATCH changes only what it names, and
a parent queue adds up its children."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from schemas.jobs import JobAdmitted
from schemas.teams import QueueConfigured
from services.runtime import EventStore
from tests.api.builders import node, reserved
from tests.api.conftest import Api
from tests.api.test_cluster_api import eventually

pytestmark = pytest.mark.integration


async def put(api: Api, name: str, **body: Any) -> Any:
    return await api.client.put(f"/v1/queues/{name}", json=body, headers=api.as_admin())


async def patch(api: Api, name: str, **body: Any) -> Any:
    return await api.client.patch(f"/v1/queues/{name}", json=body, headers=api.as_admin())


async def test_a_parent_cycle_is_refused(api: Api) -> None:
    assert (await put(api, "org", guaranteed_gpus=16)).status_code == 200
    assert (await put(api, "nlp", parent="org", guaranteed_gpus=8)).status_code == 200
    response = await put(api, "org", parent="nlp", guaranteed_gpus=16)
    assert response.status_code == 422
    assert "cycle" in response.json()["detail"]


async def test_an_unknown_parent_is_refused(api: Api) -> None:
    response = await put(api, "nlp", parent="nowhere", guaranteed_gpus=8)
    assert response.status_code == 422
    assert "parent queue nowhere does not exist" in response.json()["detail"]
    team = await api.client.post(
        "/v1/teams", json={"name": "cv", "parent": "nowhere"}, headers=api.as_admin()
    )
    assert team.status_code == 422


async def test_guarantees_must_fit_the_cluster_and_the_parent(api: Api, store: EventStore) -> None:
    await store.append("node-n1", 0, [node("n1")])  # 8 GPUs in all
    await eventually(api, "/v1/nodes", lambda body: len(body["items"]) == 1)
    beyond = await put(api, "org", guaranteed_gpus=1000)
    assert beyond.status_code == 422 and "the cluster has 8" in beyond.json()["detail"]
    assert (await put(api, "org", guaranteed_gpus=8)).status_code == 200
    assert (await put(api, "nlp", parent="org", guaranteed_gpus=6)).status_code == 200
    over = await put(api, "cv", parent="org", guaranteed_gpus=4)
    assert over.status_code == 422 and "guaranteed 10 GPUs" in over.json()["detail"]


async def test_patch_changes_only_the_fields_given(api: Api) -> None:
    assert (await put(api, "nlp", guaranteed_gpus=8, max_gpus=32, weight=2)).status_code == 200
    response = await patch(api, "nlp", guaranteed_gpus=16)
    assert response.status_code == 200
    body = response.json()
    assert (body["guaranteed_gpus"], body["max_gpus"], body["weight"]) == (16, 32, 2.0)
    unlimited = (await patch(api, "nlp", max_gpus=None)).json()
    assert (unlimited["guaranteed_gpus"], unlimited["max_gpus"]) == (16, None)
    assert (await patch(api, "nlp", max_gpus=4)).status_code == 422
    assert (await patch(api, "nobody", weight=3)).status_code == 404


async def test_a_parent_queue_adds_up_its_children(api: Api, store: EventStore) -> None:
    await store.append("node-n1", 0, [node("n1")])
    assert (await put(api, "org", guaranteed_gpus=8)).status_code == 200
    await api.create_team("nlp", guaranteed_gpus=0)  # the API takes jobs of known teams only
    assert (await put(api, "nlp", parent="org", guaranteed_gpus=4)).status_code == 200
    job_id = await api.submit(api.as_admin(), team="nlp", tasks=1, gpus_per_task=4)
    await store.append(
        f"job-{job_id}",
        None,
        [
            JobAdmitted(job_id=job_id, queue="nlp", priority="research"),
            reserved(job_id, [("n1", [0, 1, 2, 3])]),
        ],
    )
    listed = await eventually(
        api, "/v1/queues", lambda body: any(q["allocated_gpus"] for q in body["items"])
    )
    queues = {queue["name"]: queue for queue in listed["items"]}
    assert queues["nlp"]["allocated_gpus"] == 4
    assert (queues["org"]["allocated_gpus"], queues["org"]["running_jobs"]) == (4, 1)


async def test_concurrent_changes_make_no_cycle(api: Api, store: EventStore) -> None:
    """Two changes that each fit alone but make a cycle together, sent at once: one is
    refused (each was checked against a tree the other had not reached yet, and both were
    written)."""
    for name in ("qa", "qb"):
        assert (await put(api, name, guaranteed_gpus=0)).status_code == 200
    answers = await asyncio.gather(
        put(api, "qa", parent="qb", guaranteed_gpus=0),
        put(api, "qb", parent="qa", guaranteed_gpus=0),
    )
    assert sorted(answer.status_code for answer in answers) == [200, 422]
    parents = {
        envelope.payload.name: envelope.payload.parent
        for envelope in await store.read_all(0)
        if isinstance(envelope.payload, QueueConfigured)
    }
    assert not (parents["qa"] == "qb" and parents["qb"] == "qa")


async def test_concurrent_teams_never_guarantee_more_than_the_cluster(
    api: Api, store: EventStore
) -> None:
    await store.append("node-n1", 0, [node("n1")])  # 8 GPUs in all
    await eventually(api, "/v1/nodes", lambda body: len(body["items"]) == 1)
    answers = await asyncio.gather(
        *(
            api.client.post(
                "/v1/teams",
                json={"name": f"t{n}", "guaranteed_gpus": 8, "max_gpus": 8},
                headers=api.as_admin(),
            )
            for n in range(4)
        ),
        put(api, "org", guaranteed_gpus=8),
    )
    assert sum(answer.status_code in (200, 201) for answer in answers) == 1
    assert sum(answer.status_code == 422 for answer in answers) == 4
    guarantees = {
        envelope.payload.name: envelope.payload.guaranteed_gpus
        for envelope in await store.read_all(0)
        if isinstance(envelope.payload, QueueConfigured) and envelope.payload.parent is None
    }
    assert sum(guarantees.values()) <= 8


async def test_guarantees_already_past_the_cluster_can_be_lowered(
    api: Api, store: EventStore
) -> None:
    """A tree the log holds past the cluster (written before the checks were serialised):
    a change that lowers it is taken, one that adds to it is not."""
    await store.append("node-n1", 0, [node("n1")])  # 8 GPUs in all
    await eventually(api, "/v1/nodes", lambda body: len(body["items"]) == 1)
    for name in ("qa", "qb"):
        event = QueueConfigured(name=name, parent=None, guaranteed_gpus=8, max_gpus=8)
        await store.append(event.stream, 0, [event])
    await eventually(api, "/v1/queues", lambda body: len(body["items"]) == 2)
    assert (await patch(api, "qa", guaranteed_gpus=9, max_gpus=9)).status_code == 422
    assert (await patch(api, "qa", weight=2)).status_code == 200
    assert (await patch(api, "qa", guaranteed_gpus=0)).status_code == 200


async def test_many_changes_at_once_all_complete(api: Api) -> None:
    """Each change waited for the quota tree's lock on a connection of its own, and the one
    holding the lock needed one more to reach the log's head: twice the pool's size of
    changes at once took every connection, and the API stopped answering anyone."""
    assert (await put(api, "nlp", guaranteed_gpus=0)).status_code == 200
    async with asyncio.timeout(60):
        answers = await asyncio.gather(*(patch(api, "nlp", weight=1 + n % 5) for n in range(30)))
    assert [answer.status_code for answer in answers] == [200] * 30


async def test_patches_of_different_fields_at_once_each_keep_theirs(api: Api) -> None:
    """A PATCH changes only what it names: two at once, one of max_cpus and one of weight,
    each merged what it read before the other was written, and the later one put the other's
    field back as it was (both answered 200)."""
    assert (await put(api, "nlp", guaranteed_gpus=0, max_gpus=8)).status_code == 200
    answers = await asyncio.gather(
        patch(api, "nlp", max_cpus=10), patch(api, "nlp", weight=3), patch(api, "nlp", max_gpus=4)
    )
    assert [answer.status_code for answer in answers] == [200] * 3
    listed = await api.client.get("/v1/queues", headers=api.as_admin())
    [nlp] = [queue for queue in listed.json()["items"] if queue["name"] == "nlp"]
    assert (nlp["max_cpus"], nlp["weight"], nlp["max_gpus"]) == (10, 3, 4), nlp
