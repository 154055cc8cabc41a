"""An array's view lists its elements by index, whatever order this API process learned them
in (the read models fold each element when its first event arrives: from the bus, elements'
streams may come in any order).

Found by the newcomer run: GET /v1/jobs/{array id} of a 4-element array answered
"array": [ID_1, ID_3, ID_0, ID_2]."""

from __future__ import annotations

from datetime import UTC, datetime

from schemas.jobs import JobSpec, JobState
from services.api.auth import Principal
from services.api.projections.jobs import JobReadModel
from services.api.views import array_view

NOW = datetime(2026, 11, 23, tzinfo=UTC)
SPEC = JobSpec.model_validate(
    {"name": "sweep", "team": "nlp", "gpus_per_task": 1, "array": {"count": 4}}
)


def element(index: int, state: JobState = "queued") -> JobReadModel:
    return JobReadModel(
        id=f"a1b2c3d4e5f6_{index}",
        spec=SPEC,
        submitted_by="team:nlp",
        submitted_at=NOW,
        submit_position=10 + index,
        queue="nlp",
        priority="research",
        updated_at=NOW,
        state=state,
        array_id="a1b2c3d4e5f6",
        array_index=index,
    )


def test_an_arrays_elements_are_listed_by_index() -> None:
    learned = [element(1, "running"), element(3), element(0, "running"), element(2)]

    view = array_view("a1b2c3d4e5f6", learned, Principal(team=None), {})

    ids = [f"a1b2c3d4e5f6_{index}" for index in range(4)]
    assert view.array == ids
    assert [e.id for e in view.elements] == ids
    assert view.states == {"queued": 2, "running": 2}
