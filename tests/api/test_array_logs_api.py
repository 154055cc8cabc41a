"""GET /v1/jobs/{array id}/logs: an array has no output of its own, so the answer names its
elements (whose logs there are) instead of saying that a job the caller just submitted does
not exist. Another team still learns nothing of the array.

Found by the newcomer run: `gangway logs ID` of an array (the id `gangway submit` printed)
answered "job ID not found", while `gangway job ID` showed the array."""

from __future__ import annotations

import pytest

from tests.api.conftest import Api

pytestmark = pytest.mark.integration


async def test_the_logs_of_an_array_id_name_its_elements(api: Api) -> None:
    nlp = await api.create_team("nlp")
    vision = await api.create_team("vision")
    body = {"name": "sweep", "team": "nlp", "gpus_per_task": 1, "array": {"count": 3}}
    created = await api.client.post("/v1/jobs", json=body, headers=nlp)
    assert created.status_code == 201, created.text
    array_id = created.json()["id"]

    answer = await api.client.get(f"/v1/jobs/{array_id}/logs", headers=nlp)

    assert answer.status_code == 404
    assert answer.headers["content-type"].startswith("application/problem+json")
    assert answer.json()["detail"] == (
        f"job {array_id} is an array of 3 jobs and has no output of its own: "
        f"ask for one of its elements ({array_id}_0 … {array_id}_2)"
    )

    foreign = await api.client.get(f"/v1/jobs/{array_id}/logs", headers=vision)
    assert foreign.status_code == 404
    assert foreign.json()["detail"] == f"job {array_id} not found"
