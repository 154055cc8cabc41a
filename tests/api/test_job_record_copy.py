"""The fold's record copy (`_changed`) is `dataclasses.replace`, field for field."""

from __future__ import annotations

from dataclasses import fields, replace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from services.api.projections.jobs import JobReadModel, _changed
from services.api.projections.model import ReadModels
from tests.api.builders import Log, reserved, submitted

NAMES = [f.name for f in fields(JobReadModel)]


def _held_job() -> JobReadModel:
    models = ReadModels()
    models.apply_all(Log().record(submitted("j1"), reserved("j1", [("n1", [0, 1])])))
    return models.jobs["j1"]


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(NAMES),
        st.one_of(st.integers(), st.text(max_size=5), st.none(), st.frozensets(st.integers())),
    )
)
def test_a_changed_record_is_what_replace_makes(changes: dict[str, Any]) -> None:
    job = _held_job()
    before = {name: getattr(job, name) for name in NAMES}
    made = _changed(job, **changes)
    expected = replace(job, **changes)
    assert made is not job and type(made) is JobReadModel
    assert [getattr(made, name) for name in NAMES] == [getattr(expected, name) for name in NAMES]
    assert {name: getattr(job, name) for name in NAMES} == before  # the old record stands


def test_every_field_is_copied() -> None:
    job = _held_job()
    made = _changed(job)
    assert made == job and made is not job
    assert all(getattr(made, name) is getattr(job, name) for name in NAMES)
