"""Pipelines, arrays, batches, holds and updates over REST, against the real log.

Every answer here is what the log then holds: a refused request writes nothing, an accepted
one writes its events in one append.
"""

from __future__ import annotations

from typing import Any

import pytest

from schemas.jobs import (
    MAX_DEPENDENCIES,
    Dependency,
    JobAdmitted,
    JobCancelled,
    JobHeld,
    JobHoldReleased,
    JobSubmitted,
    JobUpdated,
    TaskStarted,
)
from services.api import pipelines
from services.runtime import EventStore
from tests.api.builders import reserved
from tests.api.conftest import Api

pytestmark = pytest.mark.integration


def spec(name: str, team: str = "nlp", **fields: Any) -> dict[str, Any]:
    return {"name": name, "team": team, "tasks": 1, "gpus_per_task": 1, **fields}


async def submitted(store: EventStore, job_id: str) -> JobSubmitted:
    [envelope] = await store.read_stream(f"job-{job_id}")
    assert isinstance(envelope.payload, JobSubmitted)
    return envelope.payload


# ---------------------------------------------------------------- dependencies


async def test_a_dependency_on_an_existing_job_is_recorded_by_id(
    api: Api, store: EventStore
) -> None:
    nlp = await api.create_team("nlp")
    prep = await api.submit(nlp, name="prep")
    response = await api.client.post(
        "/v1/jobs",
        json=spec("train", depends_on=[{"job": prep, "condition": "succeeded"}]),
        headers=nlp,
    )
    assert response.status_code == 201, response.text
    train = response.json()["id"]
    event = await submitted(store, train)
    assert [(d.job, d.condition) for d in event.spec.depends_on] == [(prep, "succeeded")]
    job = (await api.client.get(f"/v1/jobs/{train}", headers=nlp)).json()
    assert job["spec"]["depends_on"] == [{"job": prep, "condition": "succeeded"}]


@pytest.mark.parametrize("whose", ["unknown", "another team's"])
async def test_a_dependency_on_an_unknown_or_foreign_job_is_refused(
    api: Api, store: EventStore, whose: str
) -> None:
    nlp = await api.create_team("nlp")
    vision = await api.create_team("vision")
    other = "feedfeedfeed" if whose == "unknown" else await api.submit(vision, team="vision")
    before = await store.head()
    response = await api.client.post(
        "/v1/jobs", json=spec("train", depends_on=[{"job": other}]), headers=nlp
    )
    assert response.status_code == 422, response.text
    assert response.headers["content-type"] == "application/problem+json"
    assert response.json()["type"].endswith("/unknown-dependency")
    assert await store.head() == before


async def test_a_job_named_twice_is_one_dependency_and_contradictory_conditions_are_refused(
    api: Api, store: EventStore
) -> None:
    nlp = await api.create_team("nlp")
    prep = await api.submit(nlp, name="prep")
    twice = [{"job": prep, "condition": "succeeded"}, {"job": prep, "condition": "succeeded"}]
    response = await api.client.post("/v1/jobs", json=spec("train", depends_on=twice), headers=nlp)
    assert response.status_code == 201, response.text
    event = await submitted(store, response.json()["id"])
    assert [(d.job, d.condition) for d in event.spec.depends_on] == [(prep, "succeeded")]
    before = await store.head()
    both = [{"job": prep, "condition": "succeeded"}, {"job": prep, "condition": "failed"}]
    response = await api.client.post("/v1/jobs", json=spec("eval", depends_on=both), headers=nlp)
    assert response.status_code == 422, response.text
    assert response.headers["content-type"] == "application/problem+json"
    assert response.json()["type"].endswith("/contradictory-dependency")
    assert prep in response.json()["detail"]
    assert await store.head() == before


async def test_a_request_naming_more_unseen_jobs_than_one_job_may_depend_on_is_refused(
    api: Api, store: EventStore
) -> None:
    # Each unseen id costs the API reads of the log: one request may not make it do thousands.
    nlp = await api.create_team("nlp")
    before = await store.head()
    response = await api.client.post(
        "/v1/jobs:batch",
        json={
            "jobs": [
                spec(f"j{n}", depends_on=[{"job": f"ghost-{n}-{k}"} for k in range(40)])
                for n in range(2)
            ]
        },
        headers=nlp,
    )
    assert response.status_code == 422, response.text
    assert response.headers["content-type"] == "application/problem+json"
    problem = response.json()
    assert problem["type"].endswith("/too-many-dependencies")
    assert "80 jobs" in problem["detail"]
    assert await store.head() == before


async def test_the_unseen_jobs_limit_tells_nothing_of_another_teams_job(
    api: Api, store: EventStore
) -> None:
    """The limit on jobs this API has not seen counted another team's job it had seen as
    known: 64 made-up ids and one more answered `too-many-dependencies` when the one more was
    made up too, and `unknown-dependency` when it was another team's job, an oracle for
    whether another team's job id exists."""
    nlp = await api.create_team("nlp")
    vision = await api.create_team("vision")
    theirs = await api.submit(vision, team="vision")
    answers = []
    for other in ("feedfeedfeed", theirs):
        ghosts = [{"job": f"{n:012x}"} for n in range(MAX_DEPENDENCIES)]
        batch = {"jobs": [spec("a", depends_on=ghosts), spec("b", depends_on=[{"job": other}])]}
        response = await api.client.post("/v1/jobs:batch", json=batch, headers=nlp)
        assert response.status_code == 422, response.text
        problem = response.json()
        answers.append((problem["type"], problem["detail"].replace(other, "X")))
    assert answers[0] == answers[1]
    assert answers[0][0].endswith("/too-many-dependencies")


@pytest.mark.parametrize("where", ["existing", "batch"])
async def test_naming_a_large_array_again_and_again_is_refused_before_any_dependency_is_built(
    api: Api, store: EventStore, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """64 names of an array of 500 are 32,000 dependencies: they were all built before the
    count was checked, so a batch of such specs held the worker (every team's requests) for
    minutes only to refuse it (8 s for ten specs on the attack round's stack)."""
    nlp = await api.create_team("nlp")
    built: list[object] = []

    class Counted(Dependency):
        def __init__(self, **fields: Any) -> None:
            built.append(fields)
            super().__init__(**fields)

    monkeypatch.setattr(pipelines, "Dependency", Counted)
    if where == "existing":
        array = await api.client.post(
            "/v1/jobs", json=spec("sweep", array={"count": 500}, hold=True), headers=nlp
        )
        assert array.status_code == 201, array.text
        sweep, jobs = array.json()["id"], []
    else:
        sweep, jobs = "sweep", [spec("sweep", array={"count": 500}, hold=True)]
    before = await store.head()
    jobs += [spec(f"eval{n}", depends_on=[{"job": sweep}] * 64) for n in range(3)]
    response = await api.client.post("/v1/jobs:batch", json={"jobs": jobs}, headers=nlp)
    assert response.status_code == 422, response.text
    assert response.headers["content-type"] == "application/problem+json"
    problem = response.json()
    assert problem["type"].endswith("/invalid-batch")
    assert {error["type"] for error in problem["errors"]} == {"too-many-dependencies"}
    assert "32000 jobs" in problem["detail"]
    assert built == []
    assert await store.head() == before


async def test_a_dependency_cycle_in_a_batch_is_refused_with_a_problem(
    api: Api, store: EventStore
) -> None:
    nlp = await api.create_team("nlp")
    before = await store.head()
    response = await api.client.post(
        "/v1/jobs:batch",
        json={
            "jobs": [
                spec("a", depends_on=[{"job": "c"}]),
                spec("b", depends_on=[{"job": "a"}]),
                spec("c", depends_on=[{"job": "b"}]),
            ]
        },
        headers=nlp,
    )
    assert response.status_code == 422, response.text
    problem = response.json()
    assert problem["type"].endswith("/dependency-cycle")
    assert "a → c → b → a" in problem["detail"]
    assert await store.head() == before


async def test_a_job_that_depends_on_itself_is_a_cycle(api: Api) -> None:
    nlp = await api.create_team("nlp")
    response = await api.client.post(
        "/v1/jobs:batch", json={"jobs": [spec("a", depends_on=[{"job": "a"}])]}, headers=nlp
    )
    assert response.status_code == 422
    assert response.json()["type"].endswith("/dependency-cycle")


async def test_a_batch_pipeline_names_its_earlier_stages_and_is_written_at_once(
    api: Api, store: EventStore
) -> None:
    nlp = await api.create_team("nlp")
    before = await store.head()
    response = await api.client.post(
        "/v1/jobs:batch",
        json={
            "jobs": [
                spec("preprocess"),
                spec("train", depends_on=[{"job": "preprocess"}]),
                spec("eval", depends_on=[{"job": "train", "condition": "finished"}]),
            ]
        },
        headers=nlp,
    )
    assert response.status_code == 201, response.text
    jobs = response.json()["jobs"]
    assert [job["state"] for job in jobs] == ["pending"] * 3
    prep, train, evaluate = (job["id"] for job in jobs)
    assert await store.head() == before + 3
    assert [(d.job, d.condition) for d in (await submitted(store, train)).spec.depends_on] == [
        (prep, "succeeded")
    ]
    assert [(d.job, d.condition) for d in (await submitted(store, evaluate)).spec.depends_on] == [
        (train, "finished")
    ]


# ---------------------------------------------------------------- batches


async def test_a_batch_with_one_invalid_spec_is_rejected_whole_with_per_item_errors(
    api: Api, store: EventStore
) -> None:
    nlp = await api.create_team("nlp")
    before = await store.head()
    response = await api.client.post(
        "/v1/jobs:batch",
        json={
            "jobs": [
                spec("good"),
                spec("bad", priority="no-such-class"),
                spec("worse", queue="nowhere"),
            ]
        },
        headers=nlp,
    )
    assert response.status_code == 422, response.text
    problem = response.json()
    assert [(e["loc"], e["type"]) for e in problem["errors"]] == [
        (["body", "jobs", 1], "unknown-priority"),
        (["body", "jobs", 2], "unknown-queue"),
    ]
    assert await store.head() == before


async def test_a_batch_with_a_malformed_spec_is_rejected_whole(api: Api, store: EventStore) -> None:
    nlp = await api.create_team("nlp")
    before = await store.head()
    response = await api.client.post(
        "/v1/jobs:batch", json={"jobs": [spec("good"), spec("bad", tasks=0)]}, headers=nlp
    )
    assert response.status_code == 422
    assert any(error["loc"][:3] == ["body", "jobs", 1] for error in response.json()["errors"])
    assert await store.head() == before


async def test_a_batch_past_the_teams_pending_cap_is_refused_whole(
    api: Api, store: EventStore
) -> None:
    nlp = await api.create_team("nlp")
    policy = await api.client.put(
        "/v1/teams/nlp/policy", json={"max_pending_jobs": 2}, headers=api.as_admin()
    )
    assert policy.status_code < 300, policy.text
    before = await store.head()
    response = await api.client.post(
        "/v1/jobs:batch", json={"jobs": [spec("a"), spec("b"), spec("c")]}, headers=nlp
    )
    assert response.status_code == 429
    assert await store.head() == before


# ---------------------------------------------------------------- arrays


async def test_an_array_lists_its_elements_and_each_knows_its_index(
    api: Api, store: EventStore
) -> None:
    nlp = await api.create_team("nlp")
    response = await api.client.post(
        "/v1/jobs", json=spec("sweep", array={"count": 5, "max_parallel": 2}), headers=nlp
    )
    assert response.status_code == 201, response.text
    body = response.json()
    array_id = body["id"]
    assert body["array"] == [f"{array_id}_{index}" for index in range(5)]
    third = await submitted(store, f"{array_id}_3")
    assert (third.array_id, third.array_index) == (array_id, 3)
    element = (await api.client.get(f"/v1/jobs/{array_id}_3", headers=nlp)).json()
    assert (element["array_id"], element["array_index"]) == (array_id, 3)
    whole = (await api.client.get(f"/v1/jobs/{array_id}", headers=nlp)).json()
    assert (whole["count"], whole["max_parallel"], whole["states"]) == (5, 2, {"pending": 5})
    assert whole["array"] == body["array"]


async def test_an_array_larger_than_the_bound_is_refused(api: Api) -> None:
    nlp = await api.create_team("nlp")
    response = await api.client.post(
        "/v1/jobs", json=spec("flood", array={"count": 100_000}), headers=nlp
    )
    assert response.status_code == 422
    assert response.headers["content-type"] == "application/problem+json"


async def test_cancelling_an_array_cancels_every_element_and_one_element_alone(
    api: Api, store: EventStore
) -> None:
    nlp = await api.create_team("nlp")
    body = (
        await api.client.post("/v1/jobs", json=spec("sweep", array={"count": 3}), headers=nlp)
    ).json()
    array_id, elements = body["id"], body["array"]
    one = await api.client.post(f"/v1/jobs/{elements[0]}/cancel", headers=nlp)
    assert one.status_code == 202 and one.json()["requested"] == ["cancel"]
    whole = await api.client.post(f"/v1/jobs/{array_id}/cancel", headers=nlp)
    assert whole.status_code == 202, whole.text
    assert [e["requested"] for e in whole.json()["elements"]] == [["cancel"]] * 3
    vision = await api.create_team("vision")
    assert (await api.client.post(f"/v1/jobs/{array_id}/cancel", headers=vision)).status_code == (
        404
    )


async def test_a_request_on_a_whole_array_is_one_append_of_every_element(
    api: Api, store: EventStore
) -> None:
    """A thousand elements asked one by one were a thousand writes (tens of seconds on a
    busy machine): the elements that can be cancelled are written together, the others left
    as they are."""
    nlp = await api.create_team("nlp")
    body = (
        await api.client.post("/v1/jobs", json=spec("sweep", array={"count": 4}), headers=nlp)
    ).json()
    array_id, elements = body["id"], body["array"]
    first = await api.client.post(f"/v1/jobs/{elements[0]}/cancel", headers=nlp)
    assert first.status_code == 202, first.text
    head = await store.head()
    whole = await api.client.post(f"/v1/jobs/{array_id}/cancel", headers=nlp)
    assert whole.status_code == 202, whole.text
    written = await store.read_all(after_position=head)
    assert sorted(e.stream for e in written) == [f"job-{e}" for e in elements[1:]]
    assert {e.payload.type for e in written} == {"JobCancelRequested"}
    assert len({e.correlation_id for e in written}) == 1
    assert [e.position for e in written] == list(range(head + 1, head + 4))


async def test_an_element_that_moved_between_the_look_and_the_write_is_decided_again(
    api: Api, store: EventStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another worker holds element 1 after this one judged the array at the log's head: the
    one append conflicts and writes nothing, and each element is then decided on its own, so
    element 1 is not held twice."""
    nlp = await api.create_team("nlp")
    sweep = (
        await api.client.post("/v1/jobs", json=spec("sweep", array={"count": 3}), headers=nlp)
    ).json()
    feed = (await api.app.state.bootstrap.context()).commands.feed
    reach_head = feed.reach_head
    moved: list[int] = []

    async def then_another_worker_holds_element_1() -> None:
        await reach_head()
        if not moved:
            stream = f"job-{sweep['array'][1]}"
            version = len(await store.read_stream(stream))
            await store.append(stream, version, [JobHeld(job_id=sweep["array"][1], by="other")])
            moved.append(version)

    monkeypatch.setattr(feed, "reach_head", then_another_worker_holds_element_1)
    held = await api.client.post(f"/v1/jobs/{sweep['id']}/hold", headers=nlp)
    assert held.status_code == 200, held.text
    assert moved and [e["held"] for e in held.json()["elements"]] == [True, True, True]
    for element in sweep["array"]:
        kinds = [e.payload.type for e in await store.read_stream(f"job-{element}")]
        assert kinds == ["JobSubmitted", "JobHeld"], element


async def test_an_array_none_of_whose_elements_can_be_asked_is_a_409_that_writes_nothing(
    api: Api, store: EventStore
) -> None:
    nlp = await api.create_team("nlp")
    sweep = (
        await api.client.post("/v1/jobs", json=spec("sweep", array={"count": 2}), headers=nlp)
    ).json()
    resumed = await api.client.post(f"/v1/jobs/{sweep['id']}/resume", headers=nlp)
    assert resumed.status_code == 409, resumed.text
    assert resumed.headers["content-type"] == "application/problem+json"
    assert resumed.json()["detail"] == f"no element of array {sweep['id']} can be resumed"
    kinds = [e.payload.type for e in await store.read_all(after_position=0)]
    assert "JobResumeRequested" not in kinds


async def test_an_array_none_of_whose_elements_can_be_held_or_changed_says_so_of_the_array(
    api: Api, store: EventStore
) -> None:
    """attack12: `gangway hold ARRAY` of an array whose elements had all ended answered "job
    ARRAY_4 is succeeded; only a waiting job can be held", naming one element the user never
    asked about, where cancel, suspend and resume name the array."""
    nlp = await api.create_team("nlp")
    sweep = (
        await api.client.post("/v1/jobs", json=spec("sweep", array={"count": 2}), headers=nlp)
    ).json()
    for element in sweep["array"]:
        stream = f"job-{element}"
        version = len(await store.read_stream(stream))
        await store.append(stream, version, [JobCancelled(job_id=element, reason="test")])
    asked = {
        "held": await api.client.post(f"/v1/jobs/{sweep['id']}/hold", headers=nlp),
        "released": await api.client.post(f"/v1/jobs/{sweep['id']}/release", headers=nlp),
        "changed": await api.client.patch(
            f"/v1/jobs/{sweep['id']}", json={"max_retries": 1}, headers=nlp
        ),
    }
    for verb, answer in asked.items():
        assert answer.status_code == 409, answer.text
        assert answer.json()["detail"].startswith(
            f"no element of array {sweep['id']} can be {verb}"
        ), answer.text


# ---------------------------------------------------------------- holds


async def test_hold_and_release_are_events_and_show_in_the_reason(
    api: Api, store: EventStore
) -> None:
    nlp = await api.create_team("nlp")
    job_id = await api.submit(nlp)
    held = await api.client.post(f"/v1/jobs/{job_id}/hold", headers=nlp)
    assert held.status_code == 200, held.text
    assert (held.json()["held"], held.json()["reason_code"]) == (True, "held")
    again = await api.client.post(f"/v1/jobs/{job_id}/hold", headers=nlp)
    assert again.status_code == 200
    released = await api.client.post(f"/v1/jobs/{job_id}/release", headers=nlp)
    assert released.status_code == 200 and released.json()["held"] is False
    kinds = [type(e.payload) for e in await store.read_stream(f"job-{job_id}")]
    assert kinds == [JobSubmitted, JobHeld, JobHoldReleased]


async def test_a_job_submitted_held_stays_held_through_admission(
    api: Api, store: EventStore
) -> None:
    nlp = await api.create_team("nlp")
    job_id = await api.submit(nlp, hold=True)
    await store.append(
        f"job-{job_id}", 1, [JobAdmitted(job_id=job_id, queue="nlp", priority="research")]
    )
    job = (await api.client.get(f"/v1/jobs/{job_id}", headers=nlp)).json()
    assert job["held"] is True


async def test_a_running_job_cannot_be_held_or_changed(api: Api, store: EventStore) -> None:
    from tests.api.builders import node

    nlp = await api.create_team("nlp")
    await store.append("node-n1", 0, [node("n1")])
    job_id = await api.submit(nlp, tasks=1, gpus_per_task=2)
    await store.append(
        f"job-{job_id}",
        1,
        [
            JobAdmitted(job_id=job_id, queue="nlp", priority="research"),
            reserved(job_id, [("n1", [0, 1])]),
            TaskStarted(job_id=job_id, attempt=1, rank=0, node_id="n1"),
        ],
    )
    await api.client.get(f"/v1/jobs/{job_id}", headers=nlp)
    hold = await api.client.post(f"/v1/jobs/{job_id}/hold", headers=nlp)
    assert hold.status_code == 409, hold.text
    patch = await api.client.patch(f"/v1/jobs/{job_id}", json={"max_retries": 1}, headers=nlp)
    assert patch.status_code == 409, patch.text
    assert patch.headers["content-type"] == "application/problem+json"


# ---------------------------------------------------------------- updates


async def test_a_pending_jobs_fields_change_with_an_event(api: Api, store: EventStore) -> None:
    nlp = await api.create_team("nlp")
    job_id = await api.submit(nlp)
    response = await api.client.patch(
        f"/v1/jobs/{job_id}",
        json={"priority": "production", "max_runtime_s": 3600, "estimated_runtime_s": 600},
        headers=nlp,
    )
    assert response.status_code == 200, response.text
    job = response.json()
    assert job["priority"] == "production"
    assert (job["spec"]["max_runtime_s"], job["spec"]["estimated_runtime_s"]) == (3600, 600)
    [_, update] = [e.payload for e in await store.read_stream(f"job-{job_id}")]
    assert isinstance(update, JobUpdated) and update.changes.priority == "production"


@pytest.mark.parametrize(
    ("patch", "status"),
    [
        ({"estimated_runtime_s": 7200, "max_runtime_s": 60}, 422),
        ({"priority": "inference-critical"}, 403),
        ({"priority": "no-such-class"}, 422),
        ({"max_retries": -1}, 422),
        ({"depends_on": []}, 422),
    ],
)
async def test_an_update_is_validated_like_a_submission(
    api: Api, store: EventStore, patch: dict[str, Any], status: int
) -> None:
    nlp = await api.create_team("nlp")
    job_id = await api.submit(nlp)
    before = await store.head()
    response = await api.client.patch(f"/v1/jobs/{job_id}", json=patch, headers=nlp)
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    assert await store.head() == before


async def test_depending_on_an_array_means_every_element(api: Api, store: EventStore) -> None:
    nlp = await api.create_team("nlp")
    sweep = (
        await api.client.post("/v1/jobs", json=spec("sweep", array={"count": 3}), headers=nlp)
    ).json()
    response = await api.client.post(
        "/v1/jobs",
        json=spec("pick-best", depends_on=[{"job": sweep["id"], "condition": "finished"}]),
        headers=nlp,
    )
    assert response.status_code == 201, response.text
    event = await submitted(store, response.json()["id"])
    assert [d.job for d in event.spec.depends_on] == sweep["array"]
    assert {d.condition for d in event.spec.depends_on} == {"finished"}


async def test_suspend_hold_and_patch_act_on_every_element_of_an_array(
    api: Api, store: EventStore
) -> None:
    nlp = await api.create_team("nlp")
    sweep = (
        await api.client.post("/v1/jobs", json=spec("sweep", array={"count": 2}), headers=nlp)
    ).json()
    held = await api.client.post(f"/v1/jobs/{sweep['id']}/hold", headers=nlp)
    assert held.status_code == 200, held.text
    assert [e["held"] for e in held.json()["elements"]] == [True, True]
    patched = await api.client.patch(
        f"/v1/jobs/{sweep['id']}", json={"max_retries": 7, "hold": False}, headers=nlp
    )
    assert patched.status_code == 200, patched.text
    assert [(e["spec"]["max_retries"], e["held"]) for e in patched.json()["elements"]] == [
        (7, False),
        (7, False),
    ]
    suspended = await api.client.post(f"/v1/jobs/{sweep['id']}/suspend", headers=nlp)
    assert suspended.status_code == 202
    assert [e["requested"] for e in suspended.json()["elements"]] == [["suspend"], ["suspend"]]
    for element in sweep["array"]:
        kinds = [e.payload.type for e in await store.read_stream(f"job-{element}")]
        assert kinds == [
            "JobSubmitted",
            "JobHeld",
            "JobUpdated",
            "JobHoldReleased",
            "JobSuspendRequested",
        ]


async def test_a_patch_of_an_array_invalid_for_one_element_changes_no_element(
    api: Api, store: EventStore
) -> None:
    """Element 2 was given a longer estimate alone: a max_runtime_s below it is invalid for
    that element, and the 422 must leave every element as it was (it changed elements 0 and 1
    before refusing)."""
    nlp = await api.create_team("nlp")
    sweep = (
        await api.client.post("/v1/jobs", json=spec("sweep", array={"count": 3}), headers=nlp)
    ).json()
    longer = await api.client.patch(
        f"/v1/jobs/{sweep['array'][2]}", json={"estimated_runtime_s": 1000}, headers=nlp
    )
    assert longer.status_code == 200, longer.text
    head = await store.head()
    patched = await api.client.patch(
        f"/v1/jobs/{sweep['id']}", json={"max_runtime_s": 500}, headers=nlp
    )
    assert patched.status_code == 422, patched.text
    assert patched.headers["content-type"] == "application/problem+json"
    assert await store.head() == head
    view = (await api.client.get(f"/v1/jobs/{sweep['id']}", headers=nlp)).json()
    assert [e["spec"].get("max_runtime_s") for e in view["elements"]] == [None, None, None]


async def test_a_batch_retried_with_its_idempotency_key_creates_nothing_new(
    api: Api, store: EventStore
) -> None:
    nlp = await api.create_team("nlp")
    body = {"jobs": [spec("a"), spec("b", depends_on=[{"job": "a"}])]}
    headers = {**nlp, "Idempotency-Key": "pipeline-42"}
    first = await api.client.post("/v1/jobs:batch", json=body, headers=headers)
    assert first.status_code == 201, first.text
    head = await store.head()
    again = await api.client.post("/v1/jobs:batch", json=body, headers=headers)
    assert again.status_code == 201, again.text
    assert again.json() == first.json()
    assert await store.head() == head


@pytest.mark.parametrize(
    ("route", "first", "second"),
    [
        (
            "/v1/jobs:batch",
            {"jobs": [spec("a"), spec("b")]},
            {"jobs": [spec("a", command=["rm", "-rf", "/data"]), spec("b", gpus_per_task=8)]},
        ),
        ("/v1/jobs", spec("sweep", array={"count": 2}), spec("other", array={"count": 2})),
    ],
)
async def test_an_idempotency_key_reused_for_other_jobs_is_refused(
    api: Api, store: EventStore, route: str, first: dict[str, Any], second: dict[str, Any]
) -> None:
    """The same key with different specs is a mistake, not a retry: the caller must not be
    told that its new jobs were created when the old ones are what it gets."""
    nlp = await api.create_team("nlp")
    headers = {**nlp, "Idempotency-Key": "nightly"}
    created = await api.client.post(route, json=first, headers=headers)
    assert created.status_code == 201, created.text
    head = await store.head()
    reused = await api.client.post(route, json=second, headers=headers)
    assert reused.status_code == 422, reused.text
    assert reused.headers["content-type"] == "application/problem+json"
    assert reused.json()["type"].endswith("/idempotency-key-reused")
    assert await store.head() == head


async def test_a_patch_or_a_batch_with_a_non_finite_number_is_refused(
    api: Api, store: EventStore
) -> None:
    nlp = await api.create_team("nlp")
    job_id = await api.submit(nlp, name="a")
    head = await store.head()
    headers = {**nlp, "Content-Type": "application/json"}
    for method, url, body in [
        ("PATCH", f"/v1/jobs/{job_id}", b'{"max_runtime_s": Infinity}'),
        (
            "POST",
            "/v1/jobs:batch",
            b'{"jobs": [{"name": "b", "team": "nlp", "estimated_runtime_s": Infinity}]}',
        ),
    ]:
        response = await api.client.request(method, url, content=body, headers=headers)
        assert response.status_code == 400, response.text
        assert response.headers["content-type"] == "application/problem+json"
        assert response.json()["type"].endswith("/malformed-json")
    assert await store.head() == head


async def test_one_request_creates_at_most_a_thousand_jobs(api: Api, store: EventStore) -> None:
    nlp = await api.create_team("nlp")
    before = await store.head()
    too_many = await api.client.post(
        "/v1/jobs:batch",
        json={"jobs": [spec("big", array={"count": 1000}), spec("one-more")]},
        headers=nlp,
    )
    assert too_many.status_code == 422, too_many.text
    assert too_many.json()["type"].endswith("/too-many-jobs")
    assert await store.head() == before
    largest = await api.client.post(
        "/v1/jobs", json=spec("big", array={"count": 1000, "max_parallel": 8}), headers=nlp
    )
    assert largest.status_code == 201, largest.text
    assert len(largest.json()["array"]) == 1000
    assert await store.head() == before + 1000


async def test_an_array_may_not_multiply_a_large_spec_into_the_log(
    api: Api, store: EventStore
) -> None:
    """Each element records the array's spec: a body within the cap must not become a
    thousand times its size in the log every team shares (found by the hostile-tenant run:
    a 1 MiB array of 1,000 wrote about 1 GB)."""
    nlp = await api.create_team("nlp")
    before = await store.head()
    bulky = {f"VAR_{index}": "x" * 1000 for index in range(20)}  # ~20 KiB of env
    flood = await api.client.post(
        "/v1/jobs", json=spec("bulky", env=bulky, array={"count": 1000}), headers=nlp
    )
    assert flood.status_code == 413, flood.text
    assert flood.headers["content-type"] == "application/problem+json"
    assert "per element" in flood.json()["detail"]
    in_a_batch = await api.client.post(
        "/v1/jobs:batch",
        json={"jobs": [spec(f"bulky-{n}", env=bulky, array={"count": 500}) for n in range(2)]},
        headers=nlp,
    )
    assert in_a_batch.status_code == 413, in_a_batch.text
    assert await store.head() == before
    fewer = await api.client.post(
        "/v1/jobs", json=spec("bulky", env=bulky, array={"count": 100}), headers=nlp
    )
    assert fewer.status_code == 201, fewer.text
    assert await store.head() == before + 100
