"""Synchronous validation: what the API can know is wrong gets a 4xx problem, and nothing of it
reaches the log."""

from __future__ import annotations

import asyncio
import json
import socket

import pytest

from services.runtime import EventStore
from tests.api.builders import node
from tests.api.conftest import Api

pytestmark = pytest.mark.integration

VALID = {"name": "train", "team": "nlp", "tasks": 1, "gpus_per_task": 1}
# The real server of this module (`api_url`) gives a body half a second to arrive.
API_OVERRIDES = {"body_read_timeout_s": 0.5}


async def rejected(
    api: Api, store: EventStore, body: object, status: int, slug: str, **kwargs: object
) -> dict[str, object]:
    """POST /v1/jobs with `body` (JSON, or raw bytes): the problem, and the log unchanged."""
    before = await store.head()
    if isinstance(body, bytes):
        headers = {**api.teams["nlp"], "Content-Type": "application/json"}
        response = await api.client.post("/v1/jobs", content=body, headers=headers)
    else:
        response = await api.client.post("/v1/jobs", json=body, headers=api.teams["nlp"])
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    problem: dict[str, object] = response.json()
    assert problem["type"] == f"https://gangway.dev/problems/{slug}", problem
    assert await store.head() == before, "a rejected request wrote to the log"
    return problem


@pytest.fixture
async def teams(api: Api, store: EventStore) -> None:
    await api.create_team("nlp")
    await api.create_team("vision")
    await store.append("node-n1", 0, [node("n1")])
    # Written as the inventory would: the API learns of it from the log, a moment later.
    async with asyncio.timeout(30):
        while True:
            if (await api.client.get("/v1/nodes", headers=api.as_admin())).json()["items"]:
                break
            await asyncio.sleep(0.05)


@pytest.mark.usefixtures("teams")
async def test_a_valid_job_is_accepted(api: Api) -> None:
    response = await api.client.post("/v1/jobs", json=VALID, headers=api.teams["nlp"])
    assert response.status_code == 201, response.text


@pytest.mark.usefixtures("teams")
async def test_an_unknown_team_is_refused(api: Api, store: EventStore) -> None:
    before = await store.head()
    response = await api.client.post(
        "/v1/jobs", json={**VALID, "team": "ghosts"}, headers=api.as_admin()
    )
    assert (response.status_code, response.json()["type"]) == (
        422,
        "https://gangway.dev/problems/unknown-team",
    )
    assert await store.head() == before


@pytest.mark.usefixtures("teams")
async def test_an_unknown_queue_is_refused(api: Api, store: EventStore) -> None:
    await rejected(api, store, {**VALID, "queue": "nowhere"}, 422, "unknown-queue")


@pytest.mark.usefixtures("teams")
async def test_another_teams_queue_is_refused_like_an_unknown_one(
    api: Api, store: EventStore
) -> None:
    problem = await rejected(api, store, {**VALID, "queue": "vision"}, 422, "unknown-queue")
    assert "is not a queue of team 'nlp'" in str(problem["detail"])


@pytest.mark.usefixtures("teams")
async def test_a_team_placed_under_another_keeps_its_queue_from_the_parent_team(
    api: Api, store: EventStore
) -> None:
    response = await api.client.post(
        "/v1/teams",
        json={"name": "speech", "parent": "nlp", "guaranteed_gpus": 2, "max_gpus": 8},
        headers=api.as_admin(),
    )
    assert response.status_code == 201, response.text
    speech = {"Authorization": f"Bearer {response.json()['token']}"}
    # nlp's token may not use speech's queue, and with it speech's guarantee.
    problem = await rejected(api, store, {**VALID, "queue": "speech"}, 422, "unknown-queue")
    assert "is not a queue of team 'nlp'" in str(problem["detail"])
    response = await api.client.post(
        "/v1/jobs", json={**VALID, "team": "speech", "queue": "speech"}, headers=speech
    )
    assert response.status_code == 201, response.text
    # Nor may nlp read speech's queue: its quota, its counts.
    listed = await api.client.get("/v1/queues", headers=api.teams["nlp"])
    assert [queue["name"] for queue in listed.json()["items"]] == ["nlp"]
    listed = await api.client.get("/v1/queues", headers=speech)
    assert [queue["name"] for queue in listed.json()["items"]] == ["speech"]


@pytest.mark.usefixtures("teams")
async def test_an_unknown_priority_class_is_refused(api: Api, store: EventStore) -> None:
    await rejected(api, store, {**VALID, "priority": "urgent"}, 422, "unknown-priority")


@pytest.mark.usefixtures("teams")
async def test_a_gpu_type_no_node_has_is_refused(api: Api, store: EventStore) -> None:
    await rejected(api, store, {**VALID, "gpu_type": "B200"}, 422, "unknown-gpu-type")
    response = await api.client.post(
        "/v1/jobs", json={**VALID, "gpu_type": "H100"}, headers=api.teams["nlp"]
    )
    assert response.status_code == 201, response.text


@pytest.mark.usefixtures("teams")
async def test_a_class_the_team_may_not_use_is_forbidden(api: Api, store: EventStore) -> None:
    await rejected(
        api, store, {**VALID, "priority": "inference-critical"}, 403, "priority-not-allowed"
    )


@pytest.mark.usefixtures("teams")
@pytest.mark.parametrize(
    ("field", "value"),
    [("tasks", "8"), ("preemptible", "yes"), ("max_retries", False), ("min_runtime_s", "5")],
)
async def test_json_types_are_strict(
    api: Api, store: EventStore, field: str, value: object
) -> None:
    problem = await rejected(api, store, {**VALID, field: value}, 422, "validation-error")
    assert field in str(problem["detail"])


@pytest.mark.usefixtures("teams")
async def test_a_minimum_runtime_past_the_maximum_is_refused(api: Api, store: EventStore) -> None:
    """min_runtime_s shields a gang from preemption: past max_runtime_s it shielded the whole
    run, a non-preemptible job that the team's policy never allowed (found by the hostile-tenant
    run)."""
    body = {**VALID, "min_runtime_s": 7200, "max_runtime_s": 3600}
    problem = await rejected(api, store, body, 422, "runtime-out-of-range")
    assert "min_runtime_s" in str(problem["detail"])


@pytest.mark.usefixtures("teams")
async def test_nested_json_types_are_strict_too(api: Api, store: EventStore) -> None:
    body = {**VALID, "gpus_per_task": 2, "topology": {"tp_size": "2"}}
    await rejected(api, store, body, 422, "validation-error")


@pytest.mark.usefixtures("teams")
async def test_duplicate_keys_are_refused(api: Api, store: EventStore) -> None:
    body = b'{"name": "train", "team": "nlp", "tasks": 1, "tasks": 2}'
    await rejected(api, store, body, 400, "duplicate-key")


@pytest.mark.usefixtures("teams")
@pytest.mark.parametrize(
    "body",
    [
        b'{"name": "train", "team": "nlp", "estimated_runtime_s": Infinity}',
        b'{"name": "train", "team": "nlp", "max_runtime_s": Infinity, "array": {"count": 2}}',
        b'{"name": "train", "team": "nlp", "min_runtime_s": NaN}',
        # Past a double's range Python's reader gives infinity silently: this one was 201,
        # recorded as `interval_s: null` (no periodic checkpoints), not what was acknowledged.
        b'{"name": "train", "team": "nlp", "checkpoint": {"interval_s": 1e999}}',
    ],
)
async def test_non_finite_numbers_are_not_json(api: Api, store: EventStore, body: bytes) -> None:
    """Python's JSON reader takes NaN and Infinity, JSON does not: accepted, they were
    recorded as null (a runtime limit of infinity became no limit at all)."""
    await rejected(api, store, body, 400, "malformed-json")


@pytest.mark.usefixtures("teams")
@pytest.mark.parametrize("field", ["estimated_runtime_s", "max_runtime_s", "min_runtime_s"])
async def test_a_runtime_past_any_clock_is_refused(api: Api, store: EventStore, field: str) -> None:
    """A finite but absurd runtime (1e308 s) was recorded: the scheduler's reservation of the
    next head then planned a start past what a timestamp can hold and crashed every cycle."""
    problem = await rejected(api, store, {**VALID, field: 1e308}, 422, "runtime-out-of-range")
    assert field in str(problem["detail"])


@pytest.mark.usefixtures("teams")
@pytest.mark.parametrize("cpus", [0.0004, 1e-9])
async def test_under_a_thousandth_of_a_cpu_is_refused(
    api: Api, store: EventStore, cpus: float
) -> None:
    """CPUs are counted in thousandths: 0.0004 CPUs rounded to none, so a CPU-only task asked
    nothing of any node or queue and packed without bound past every CPU ceiling."""
    body = {**VALID, "gpus_per_task": 0, "cpus_per_task": cpus}
    problem = await rejected(api, store, body, 422, "invalid-cpus")
    assert "cpus_per_task" in str(problem["detail"])


@pytest.mark.usefixtures("teams")
async def test_a_thousandth_of_a_cpu_is_accepted(api: Api) -> None:
    body = {**VALID, "gpus_per_task": 0, "cpus_per_task": 0.001}
    response = await api.client.post("/v1/jobs", json=body, headers=api.teams["nlp"])
    assert response.status_code == 201, response.text


@pytest.mark.usefixtures("teams")
async def test_an_unpaired_surrogate_in_an_env_key_is_refused(api: Api, store: EventStore) -> None:
    body = b'{"name": "train", "team": "nlp", "env": {"A\\ud800": "x"}}'
    await rejected(api, store, body, 422, "invalid-string")


@pytest.mark.usefixtures("teams")
async def test_an_unpaired_surrogate_in_a_value_is_refused(api: Api, store: EventStore) -> None:
    body = b'{"name": "train", "team": "nlp", "command": ["echo", "\\udc00"]}'
    await rejected(api, store, body, 422, "invalid-string")


@pytest.mark.usefixtures("teams")
async def test_nul_in_an_env_value_is_refused(api: Api, store: EventStore) -> None:
    body = b'{"name": "train", "team": "nlp", "env": {"A": "x\\u0000y"}}'
    await rejected(api, store, body, 422, "invalid-string")


@pytest.mark.usefixtures("teams")
@pytest.mark.parametrize("name", ["A=B", "", "PATH\u0000"])
async def test_env_names_with_equals_nul_or_nothing_are_refused(
    api: Api, store: EventStore, name: str
) -> None:
    slug = "invalid-string" if "\0" in name else "invalid-env"
    await rejected(api, store, {**VALID, "env": {name: "x"}}, 422, slug)


@pytest.mark.usefixtures("teams")
async def test_a_paired_surrogate_is_an_ordinary_character(api: Api) -> None:
    body = {**VALID, "env": {"GREETING": "\U0001f600"}}
    response = await api.client.post("/v1/jobs", json=body, headers=api.teams["nlp"])
    assert response.status_code == 201, response.text


@pytest.mark.usefixtures("teams")
async def test_a_secret_the_team_does_not_have_is_refused(api: Api, store: EventStore) -> None:
    body = {**VALID, "secret_env": {"HF_TOKEN": "hf"}}
    await rejected(api, store, body, 422, "unknown-secret")


def test_a_body_that_never_arrives_whole_gets_408_and_a_closed_connection(api_url: str) -> None:
    host, port = api_url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=60) as sock:
        sock.sendall(
            b"POST /v1/jobs HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
            b'Content-Length: 100\r\n\r\n{"name":'
        )
        received = b""
        while chunk := sock.recv(65536):  # the server closes: recv returns b""
            received += chunk
    status_line = received.split(b"\r\n", 1)[0]
    assert status_line == b"HTTP/1.1 408 Request Timeout", received
    assert b"request-timeout" in received


@pytest.mark.usefixtures("teams")
@pytest.mark.parametrize(
    ("fields", "slug", "detail"),
    [
        # nlp may use at most 64 GPUs: a gang of 72 could never start, whatever it waits for.
        (
            {"tasks": 9, "gpus_per_task": 8},
            "over-quota-max",
            "needs 72 GPUs but queue 'nlp' may never use more than 64",
        ),
        # The fleet is one node of 8 GPUs.
        (
            {"tasks": 2, "gpus_per_task": 8},
            "gang-too-large",
            "needs 2 tasks of 8 GPUs but the cluster can hold at most 1",
        ),
        (
            {"tasks": 3, "gpus_per_task": 4, "topology": {"require": "node"}},
            "gang-too-large",
            "needs 3 tasks of 4 GPUs but one node can hold at most 2",
        ),
        (
            {"tasks": 1, "gpus_per_task": 16},
            "task-too-large",
            "a task needs 16 GPUs in one NVLink domain but the largest node has 8",
        ),
        (
            {"tasks": 4, "gpus_per_task": 4, "topology": {"tp_size": 16}},
            "task-too-large",
            "a tensor-parallel group needs 16 GPUs in one NVLink domain but the largest node has 8",
        ),
    ],
)
async def test_a_gang_no_wait_could_place_is_refused_at_submit_with_admissions_reason(
    api: Api, store: EventStore, fields: dict[str, object], slug: str, detail: str
) -> None:
    problem = await rejected(api, store, {**VALID, **fields}, 422, slug)
    assert problem["detail"] == detail


@pytest.mark.usefixtures("teams")
@pytest.mark.parametrize(
    ("fields", "slug", "detail"),
    [
        # The node's GPUs are not in MIG mode: no slice could ever be cut there.
        (
            {"tasks": 1, "mig_profile": "1g.10gb"},
            "mig-profile-unavailable",
            "no node offers 1g.10gb slices: no GPU model with that profile in MIG mode "
            "(mig dynamic, or a fixed geometry holding it)",
        ),
        # Its GPUs have 81,920 MB each.
        (
            {"tasks": 1, "gpu_fraction": 0.5, "gpu_memory_mb": 100_000},
            "gpu-memory-too-large",
            "a share asks 100000 MB of GPU memory but the largest GPU that can be soft-shared "
            "has 81920 MB",
        ),
        # 8 GPUs hold at most 32 quarter shares.
        (
            {"tasks": 33, "gpu_fraction": 0.25},
            "gang-too-large",
            "needs 33 0.25 GPU shares but the cluster can hold at most 32",
        ),
    ],
)
async def test_a_slice_or_share_no_node_could_hold_is_refused_at_submit(
    api: Api, store: EventStore, fields: dict[str, object], slug: str, detail: str
) -> None:
    """It used to get 201, then wait for ever as `unsatisfiable` (the catalogue knew no MIG
    modes nor GPU memory)."""
    body = {"name": "serve", "team": "nlp", **fields}
    problem = await rejected(api, store, body, 422, slug)
    assert problem["detail"] == detail


@pytest.mark.usefixtures("teams")
async def test_a_gang_whose_minimum_fits_is_accepted_and_a_new_node_makes_room(
    api: Api, store: EventStore
) -> None:
    elastic = {**VALID, "tasks": 4, "gpus_per_task": 4, "min_tasks": 2}
    assert (await api.client.post("/v1/jobs", json=elastic, headers=api.teams["nlp"])).is_success
    wide = {**VALID, "tasks": 2, "gpus_per_task": 8}
    await rejected(api, store, wide, 422, "gang-too-large")
    await store.append("node-n2", 0, [node("n2")])
    async with asyncio.timeout(30):
        while True:
            if len((await api.client.get("/v1/nodes", headers=api.as_admin())).json()["items"]) > 1:
                break
            await asyncio.sleep(0.05)
    response = await api.client.post("/v1/jobs", json=wide, headers=api.teams["nlp"])
    assert response.status_code == 201, response.text


@pytest.mark.usefixtures("teams")
@pytest.mark.parametrize(
    "content_type",
    [None, "application/x-www-form-urlencoded", "text/plain", "multipart/form-data; boundary=x"],
)
@pytest.mark.parametrize("route", ["/v1/jobs", "/v1/jobs:batch"])
async def test_a_json_body_sent_as_another_media_type_is_a_415_that_says_what_to_send(
    api: Api, store: EventStore, route: str, content_type: str | None
) -> None:
    """`curl -d '{...}'` without `-H 'Content-Type: application/json'` sends a form: the
    newcomer was told only 'body: Input should be a valid dictionary or object to extract
    fields from' (attack16)."""
    body = json.dumps({"jobs": [VALID]} if route.endswith(":batch") else VALID).encode()
    headers = dict(api.teams["nlp"])
    if content_type is not None:
        headers["Content-Type"] = content_type
    before = await store.head()
    response = await api.client.post(route, content=body, headers=headers)
    assert response.status_code == 415, response.text
    assert response.headers["content-type"] == "application/problem+json"
    problem = response.json()
    assert problem["type"] == "https://gangway.dev/problems/unsupported-media-type"
    assert "Content-Type: application/json" in problem["detail"]
    assert await store.head() == before
    # Who calls is still known first: no token, no word on the body.
    del headers["Authorization"]
    assert (await api.client.post(route, content=body, headers=headers)).status_code == 401


@pytest.mark.usefixtures("teams")
@pytest.mark.parametrize(
    "content_type", ["application/json; charset=utf-8", "application/vnd.gangway+json"]
)
async def test_json_media_types_with_parameters_or_a_suffix_are_read(
    api: Api, content_type: str
) -> None:
    headers = {**api.teams["nlp"], "Content-Type": content_type}
    response = await api.client.post("/v1/jobs", content=json.dumps(VALID), headers=headers)
    assert response.status_code == 201, response.text


async def test_a_name_that_is_no_name_is_refused_in_words(
    api: Api, store: EventStore, teams: None
) -> None:
    # It read "String should match pattern '^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$'".
    problem = await rejected(api, store, {**VALID, "name": "my job"}, 422, "validation-error")
    assert problem["detail"] == (
        "body.name: 'my job' is not a name: 1 to 63 letters, digits, '.', '_' or '-', "
        "the first a letter or digit"
    )
