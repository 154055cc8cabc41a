"""A refused body's field errors, as the problem's `errors` and `detail` put them."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from schemas.jobs import JobSpec
from services.api.problems import field_errors, summarize


def errors_of(**spec: object) -> str:
    with pytest.raises(ValidationError) as raised:
        JobSpec.model_validate(spec)
    return summarize(field_errors(raised.value.errors()))


def test_a_name_that_is_no_name_is_told_in_words() -> None:
    # `name: my job` read "String should match pattern '^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$'".
    assert errors_of(name="my job", team="nlp") == (
        "name: 'my job' is not a name: 1 to 63 letters, digits, '.', '_' or '-', "
        "the first a letter or digit"
    )


def test_other_messages_are_pydantics() -> None:
    assert errors_of(name="a", team="nlp", tasks=0) == (
        "tasks: Input should be greater than or equal to 1"
    )


def test_a_validators_own_words_come_without_pydantics_prefix() -> None:
    # It read "spec: Value error, min_tasks must not exceed tasks".
    with pytest.raises(ValidationError) as raised:
        JobSpec.model_validate({"name": "a", "team": "nlp", "tasks": 2, "min_tasks": 3})
    [error] = field_errors(raised.value.errors())
    assert error.msg == "min_tasks must not exceed tasks"


def test_a_dependency_that_is_no_object_is_told_its_form() -> None:
    # `depends_on: [prep]` read "Input should be a valid dictionary or instance of Dependency".
    assert errors_of(name="a", team="nlp", depends_on=["prep"]) == (
        "depends_on.0: 'prep' is not a dependency: each entry is {job: <job id, or the name of "
        "a job of the same request>, condition: succeeded | finished | failed}"
    )
