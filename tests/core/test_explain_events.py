"""The explain phase builds its JobDeferred without pydantic's constructor
(core/explain_events.py): for any job, reason code and message, the event is the one
`JobDeferred.model_construct` builds, equal, hashed, serialised and folded alike."""

from __future__ import annotations

from typing import get_args

from hypothesis import given
from hypothesis import strategies as st

from core.explain_events import job_deferred
from schemas.jobs import JobDeferred
from schemas.reasons import DeferCode


@given(
    job_id=st.text(min_size=1, max_size=64),
    code=st.sampled_from(get_args(DeferCode)),
    message=st.text(max_size=200),
)
def test_the_explain_phase_event_is_the_one_pydantic_builds(
    job_id: str, code: DeferCode, message: str
) -> None:
    built = job_deferred(job_id, code, message)
    expected = JobDeferred.model_construct(job_id=job_id, code=code, message=message)

    assert type(built) is JobDeferred
    assert built == expected
    assert hash(built) == hash(expected)
    assert built.model_fields_set == expected.model_fields_set
    assert built.model_dump() == expected.model_dump()
    assert built.model_dump_json() == expected.model_dump_json()
    assert built.stream == expected.stream
    # What the log validates on the way in accepts it as what the caller gave.
    assert JobDeferred.model_validate(built.model_dump()) == expected
