"""A GET /v1/jobs page also ends at about `list_page_max_bytes` of its jobs' specs (always at
least one job; `next` continues), so that no page is built as one huge answer in the API's
memory. Found by the hostile-tenant run: one 0.9 MB submission of an array of 1,000 made a
page of 50 jobs 45 MB; a page of 1,000 would have been 0.9 GB."""

from __future__ import annotations

import pytest

from tests.api.conftest import Api

pytestmark = pytest.mark.integration

API_OVERRIDES = {"list_page_max_bytes": 100_000}


async def test_a_page_of_large_specs_ends_early_and_the_cursor_goes_on(api: Api) -> None:
    nlp = await api.create_team("nlp")
    big = await api.submit(nlp, env={"BLOB": "x" * 40_000}, array={"count": 5})
    small = await api.submit(nlp)
    elements = [f"{big}_{index}" for index in range(5)]

    seen: list[list[str]] = []
    cursor: int | None = None
    while True:
        params = {"limit": 100} | ({"after": cursor} if cursor is not None else {})
        response = await api.client.get("/v1/jobs", params=params, headers=nlp)
        assert response.status_code == 200, response.text
        assert len(response.content) < 100_000 + 50_000  # the budget and at most one job more
        page = response.json()
        seen.append([job["id"] for job in page["items"]])
        cursor = page["next"]
        if cursor is None:
            break
    assert [job for page in seen for job in page] == [*elements, small]
    assert all(page for page in seen) and len(seen) > 1
