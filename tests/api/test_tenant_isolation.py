"""Tenant isolation over EVERY route of the OpenAPI document: no token, a bad token, another
team's token, and a team token on the admin's routes each get the expected status, and no body
a team receives holds anything of another team.

Routes this table does not know yet (added later) are still tried: without a token they must
answer 401, and with another team's token they must not fail nor show that team's data.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import pytest

from schemas.jobs import JobAdmitted, JobDeferred, PreemptionRequested
from schemas.nodes import NodeDegraded, StragglerDetected
from services.runtime import EventStore
from tests.api.builders import node, reserved
from tests.api.conftest import Api

pytestmark = pytest.mark.integration

SECRET_VALUE = "vision-secret-value-5d2f"


@dataclass
class World:
    """Two teams with a job each on one node, and vision's token, secret and quota."""

    nlp: dict[str, str]
    vision: dict[str, str]
    nlp_job: str
    vision_job: str
    vision_token_id: str
    vision_token: str

    def markers(self) -> list[str]:
        """Strings that belong to vision alone: none may reach a body nlp receives."""
        return [
            "vision",
            self.vision_job,
            self.vision_token_id,
            self.vision_token,
            self.vision["Authorization"].removeprefix("Bearer "),
            SECRET_VALUE,
        ]


@pytest.fixture
async def world(api: Api, store: EventStore) -> World:
    nlp = await api.create_team("nlp")
    vision = await api.create_team("vision", guaranteed_gpus=24)
    await store.append("node-n1", 0, [node("n1")])
    jobs = {}
    for team, gpus in (("nlp", [0, 1]), ("vision", [2, 3])):
        job_id = await api.submit(api.teams[team], team=team, tasks=1, gpus_per_task=2)
        await store.append(
            f"job-{job_id}",
            1,
            [
                JobAdmitted(job_id=job_id, queue=team, priority="research"),
                reserved(job_id, [("n1", gpus)]),
            ],
        )
        jobs[team] = job_id
    # Written as the scheduler would: the API learns of them from the log, a moment later.
    async with asyncio.timeout(30):
        while True:
            nodes = (await api.client.get("/v1/nodes", headers=api.as_admin())).json()["items"]
            if nodes and set(nodes[0]["jobs"]) == set(jobs.values()):
                break
            await asyncio.sleep(0.05)
    token = await api.client.post(
        "/v1/teams/vision/tokens", json={"name": "vision-bot"}, headers=vision
    )
    assert token.status_code == 201, token.text
    secret = await api.client.put(
        "/v1/teams/vision/secrets/vision-hf", json={"value": SECRET_VALUE}, headers=vision
    )
    assert secret.status_code == 200, secret.text
    return World(
        nlp, vision, jobs["nlp"], jobs["vision"], token.json()["id"], token.json()["token"]
    )


# The admin's routes: a team token gets 403 on them, even for its own team.
ADMIN_OPERATIONS = {"createTeam", "configureQueue", "configureTeamPolicy", "deleteTeamKey"}

# What nlp's token gets on each route when pointed at vision's resources.
OTHER_TEAM_STATUS = {
    "submitJob": 403,
    "submitJobBatch": 403,
    "updateJob": 404,
    "holdJob": 404,
    "releaseJob": 404,
    "listJobs": 200,
    "getJob": 404,
    "listJobEvents": 404,
    "getJobLogs": 404,
    "getUsage": 200,
    "getDashboard": 200,
    "cancelJob": 404,
    "suspendJob": 404,
    "resumeJob": 404,
    "listEvents": 200,
    "listNodes": 200,
    "getNode": 200,
    "listQueues": 200,
    "getCluster": 200,
    "createTeam": 403,
    "configureQueue": 403,
    "configureTeamPolicy": 403,
    "getTeamPolicy": 403,
    "createTeamToken": 403,
    "listTeamTokens": 403,
    "revokeTeamToken": 403,
    "setTeamSecret": 403,
    "listTeamSecrets": 403,
    "deleteTeamSecret": 403,
    "deleteTeamKey": 403,
}

BODIES: dict[str, dict[str, Any]] = {
    "submitJob": {"name": "train", "tasks": 1, "gpus_per_task": 1},
    "updateJob": {"priority": "production"},
    "createTeam": {"name": "newcomers"},
    "configureQueue": {"guaranteed_gpus": 0},
    "configureTeamPolicy": {"allowed_priority_classes": ["inference-critical"]},
    "createTeamToken": {"name": "intruder"},
    "setTeamSecret": {"value": "overwritten"},
}


@dataclass(frozen=True)
class Operation:
    method: str
    path: str
    operation_id: str
    secured: bool
    has_body: bool


def operations(api: Api) -> list[Operation]:
    found = []
    for path, methods in api.app.openapi()["paths"].items():
        for method, operation in methods.items():
            found.append(
                Operation(
                    method.upper(),
                    path,
                    operation["operationId"],
                    bool(operation.get("security")),
                    "requestBody" in operation,
                )
            )
    return found


def request_for(op: Operation, world: World, team: str) -> dict[str, Any]:
    """The request of `op` aimed at `team`'s resources (its job, queue, token, secret)."""
    job = world.vision_job if team == "vision" else world.nlp_job
    values = {
        "job_id": job,
        "team": team,
        "node_id": "n1",
        "token_id": world.vision_token_id,
        "name": f"{team}-hf" if "/secrets/" in op.path else team,
    }
    path = op.path
    for name, value in values.items():
        path = path.replace("{" + name + "}", value)
    # A parameter this table does not know is aimed at vision's job, the likeliest leak.
    while "{" in path:
        start, end = path.index("{"), path.index("}")
        path = path[:start] + world.vision_job + path[end + 1 :]
    request: dict[str, Any] = {"method": op.method, "url": path}
    if op.has_body:
        body = dict(BODIES.get(op.operation_id, {}))
        if op.operation_id == "submitJob":
            body["team"] = team
        if op.operation_id == "submitJobBatch":
            body["jobs"] = [{**BODIES["submitJob"], "team": team}]
        request["json"] = body
    if op.operation_id == "listJobs":
        request["params"] = {"team": team}
    if op.operation_id == "listEvents":
        request["params"] = {"limit": 1000}
    return request


def test_the_table_knows_the_routes_of_this_issue(api: Api) -> None:
    known = {op.operation_id for op in operations(api)}
    assert known >= set(OTHER_TEAM_STATUS), set(OTHER_TEAM_STATUS) - known
    secured = {op.operation_id for op in operations(api) if op.secured}
    assert secured >= set(OTHER_TEAM_STATUS)


async def test_every_secured_route_refuses_a_missing_or_bad_token(api: Api, world: World) -> None:
    for op in operations(api):
        if not op.secured:
            continue
        request = request_for(op, world, "vision")
        for headers in ({}, {"Authorization": "Bearer not-a-token"}, {"Authorization": "Basic x"}):
            response = await api.client.request(**request, headers=headers)
            assert response.status_code == 401, f"{op.operation_id} {headers}: {response.text}"
            assert response.headers["content-type"] == "application/problem+json"
            assert response.headers["www-authenticate"].startswith("Bearer")


async def test_another_teams_token_neither_acts_nor_reads(
    api: Api, world: World, store: EventStore
) -> None:
    for op in operations(api):
        if not op.secured:
            continue
        before = await store.head()
        response = await api.client.request(**request_for(op, world, "vision"), headers=world.nlp)
        expected = OTHER_TEAM_STATUS.get(op.operation_id)
        where = f"{op.method} {op.path} ({op.operation_id}): {response.text[:300]}"
        if expected is not None:
            assert response.status_code == expected, where
        else:
            assert response.status_code < 500, where
        if response.status_code < 300:
            for marker in world.markers():
                assert marker not in response.text, f"{marker!r} leaked: {where}"
        else:
            assert response.headers["content-type"] == "application/problem+json", where
            assert await store.head() == before, f"a refused request wrote: {where}"
            for marker in (world.vision_token, SECRET_VALUE):
                assert marker not in response.text, where


async def test_a_team_token_cannot_use_the_admins_routes_even_for_its_own_team(
    api: Api, world: World, store: EventStore
) -> None:
    for op in operations(api):
        if op.operation_id not in ADMIN_OPERATIONS:
            continue
        before = await store.head()
        response = await api.client.request(**request_for(op, world, "nlp"), headers=world.nlp)
        assert response.status_code == 403, f"{op.operation_id}: {response.text}"
        assert await store.head() == before


async def test_what_a_team_sees_of_the_cluster(api: Api, world: World) -> None:
    queues = (await api.client.get("/v1/queues", headers=world.nlp)).json()["items"]
    assert [q["name"] for q in queues] == ["nlp"]
    [n1] = (await api.client.get("/v1/nodes", headers=world.nlp)).json()["items"]
    assert n1["jobs"] == {world.nlp_job: [0, 1]}
    assert n1["allocated_gpus"] == 4  # the node's own total, an aggregate
    cluster = (await api.client.get("/v1/cluster", headers=world.nlp)).json()
    assert (cluster["allocated_gpus"], cluster["running_jobs"]) == (4, 2)
    events = (await api.client.get("/v1/events", headers=world.nlp)).json()["items"]
    assert {e["stream"] for e in events} == {"team-nlp", "queue-nlp", f"job-{world.nlp_job}"}


async def test_the_admin_sees_everything(api: Api, world: World) -> None:
    admin = api.as_admin()
    queues = (await api.client.get("/v1/queues", headers=admin)).json()["items"]
    assert [q["name"] for q in queues] == ["nlp", "vision"]
    [n1] = (await api.client.get("/v1/nodes", headers=admin)).json()["items"]
    assert set(n1["jobs"]) == {world.nlp_job, world.vision_job}
    jobs = (await api.client.get("/v1/jobs", headers=admin)).json()["items"]
    assert {j["id"] for j in jobs} == {world.nlp_job, world.vision_job}
    events = (await api.client.get("/v1/events", headers=admin, params={"limit": 1000})).json()
    assert any(e["stream"] == "secrets-vision" for e in events["items"])
    assert SECRET_VALUE not in str(events)


async def test_a_preemption_names_no_other_teams_job(
    api: Api, store: EventStore, world: World
) -> None:
    """A preemption's words name the job it was for (the victim's reason, its events'
    `preemptor_job_id`) and the preemptor's reason names its victims: across teams, both told
    each team another team's job id, which every route otherwise keeps to itself (404)."""
    nlp_job, vision_job = world.nlp_job, world.vision_job
    why = f"preempted for job {vision_job} (reclaiming guaranteed capacity)"
    await store.append(
        f"job-{nlp_job}",
        3,
        [
            PreemptionRequested(
                job_id=nlp_job,
                attempt=1,
                preemptor_job_id=vision_job,
                reason=why,
                grace_s=30,
                code="reclaim",
            )
        ],
    )
    waiting = f"needs 2 GPUs; preempting {nlp_job}; starts once they checkpoint (within 30 s)"
    await store.append(
        f"job-{vision_job}", 3, [JobDeferred(job_id=vision_job, code="preempting", message=waiting)]
    )
    admin = api.as_admin()
    async with asyncio.timeout(30):  # the API learns of them from the log, a moment later
        while True:
            shown = await api.client.get(f"/v1/jobs/{vision_job}", headers=admin)
            if shown.json()["reason"] == waiting:
                break
            await asyncio.sleep(0.05)
    for team, own, other in (("nlp", nlp_job, vision_job), ("vision", vision_job, nlp_job)):
        headers = world.nlp if team == "nlp" else world.vision
        bodies = [
            (await api.client.get(f"/v1/jobs/{own}", headers=headers)).text,
            (await api.client.get("/v1/jobs", headers=headers)).text,
            (await api.client.get(f"/v1/jobs/{own}/events", headers=headers)).text,
            (await api.client.get("/v1/events", headers=headers)).text,
            (await api.client.get("/v1/dashboard", headers=headers)).text,
        ]
        for body in bodies:
            assert other not in body, body
        shown = (await api.client.get(f"/v1/jobs/{own}", headers=headers)).json()["reason"]
        assert shown in (
            "preempted for a job of another team (reclaiming guaranteed capacity)",
            "needs 2 GPUs; preempting a job of another team; starts once they checkpoint "
            "(within 30 s)",
        )
    # The admin sees every id.
    assert (await api.client.get(f"/v1/jobs/{nlp_job}", headers=admin)).json()["reason"] == why
    events = (await api.client.get(f"/v1/jobs/{nlp_job}/events", headers=admin)).json()["items"]
    assert events[-1]["payload"]["preemptor_job_id"] == vision_job


async def test_a_stragglers_node_names_no_other_teams_job(
    api: Api, store: EventStore, world: World
) -> None:
    """Health's straggler detail ("rank R of job J steps in …") was every node's reason in
    every team's view of the nodes and the dashboard: another team's job id (attack9)."""
    vision_job = world.vision_job
    detail = f"rank 1 of job {vision_job} steps in 5.00s against a median of 3.00s"
    await store.append(
        "node-n1",
        None,
        [
            StragglerDetected(
                node_id="n1", job_id=vision_job, rank=1, step_time_s=5, median_step_time_s=3
            ),
            NodeDegraded(node_id="n1", signal="straggler", detail=detail),
        ],
    )
    async with asyncio.timeout(30):  # the API learns of them from the log, a moment later
        while True:
            [n1] = (await api.client.get("/v1/nodes", headers=api.as_admin())).json()["items"]
            if n1["reason"] == detail:
                break
            await asyncio.sleep(0.05)
    [seen] = (await api.client.get("/v1/nodes", headers=world.nlp)).json()["items"]
    assert seen["state"] == "degraded" and seen["degraded_signals"] == ["straggler"]
    assert seen["reason"] == (
        "rank 1 of a job of another team steps in 5.00s against a median of 3.00s"
    )
    [own] = (await api.client.get("/v1/nodes", headers=world.vision)).json()["items"]
    assert own["reason"] == detail  # its own job, by its id
    one = (await api.client.get("/v1/nodes/n1", headers=world.nlp)).text
    board = (await api.client.get("/v1/dashboard", headers=world.nlp)).text
    assert vision_job not in one and vision_job not in board
    # A later reason naming no job (an operator's drain) is shown as it is.
    drain = await api.client.post(
        "/v1/nodes/n1/drain", json={"reason": "bios update"}, headers=api.as_admin()
    )
    assert drain.status_code == 200, drain.text
    [drained] = (await api.client.get("/v1/nodes", headers=world.nlp)).json()["items"]
    assert drained["reason"] == "bios update"
