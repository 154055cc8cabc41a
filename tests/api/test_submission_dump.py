"""A single submission dumps its JobSubmitted once, before its checks, and the log stores that
JSON (services/api/commands.py `_submitted_payload`): what the log cannot hold is refused as
before, first and in the same words."""

from __future__ import annotations

from typing import Any

import pytest

from schemas.jobs import JobSpec, JobSubmitted
from services.api.commands import _require_storable, _submitted_payload
from services.api.problems import ProblemError
from services.runtime import EventStore
from tests.api.conftest import Api

SPEC = {"name": "train", "team": "nlp", "tasks": 1, "gpus_per_task": 1}


def submitted(spec: dict[str, Any], by: str = "team:nlp") -> JobSubmitted:
    return JobSubmitted(job_id="0123456789ab", spec=JobSpec.model_validate(spec), submitted_by=by)


def refusal(spec: JobSpec) -> Any:
    with pytest.raises(ProblemError) as refused:
        _require_storable(spec)
    return refused.value.detail


@pytest.mark.parametrize(
    "env",
    [{"A": "\\u0000"}, {"A": "x\ud800"}, {"A": "\udc00\\u0000"}],
    ids=["escaped-nul-text", "lone-surrogate", "both"],
)
def test_what_the_log_cannot_hold_is_refused_in_the_spec_check_s_words(
    env: dict[str, str],
) -> None:
    event = submitted({**SPEC, "env": env})
    with pytest.raises(ProblemError) as refused:
        _submitted_payload(event)
    assert refused.value.status_code == 422
    assert refused.value.detail == refusal(event.spec)


def test_the_payload_is_the_event_s_json_and_only_the_spec_is_held_to_the_rule() -> None:
    event = submitted({**SPEC, "env": {"A": "b"}})
    assert _submitted_payload(event) == event.model_dump_json()
    # The same text outside the spec refuses nothing (the spec check never saw it).
    named = submitted(SPEC, by="team:nlp/\\u0000")
    assert _submitted_payload(named) == named.model_dump_json()


@pytest.mark.integration
async def test_a_submission_dumps_its_spec_once_and_the_log_holds_that_json(
    api: Api, store: EventStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    await api.create_team("nlp")
    dumps: list[str] = []
    for model in (JobSpec, JobSubmitted):
        original = model.model_dump_json

        def counted(self: Any, *args: Any, __original: Any = original, **kw: Any) -> str:
            dumps.append(type(self).__name__)
            text: str = __original(self, *args, **kw)
            return text

        monkeypatch.setattr(model, "model_dump_json", counted)
    response = await api.client.post("/v1/jobs", json=SPEC, headers=api.teams["nlp"])
    assert response.status_code == 201, response.text
    assert dumps == ["JobSubmitted"]
    [recorded] = await store.read_stream(f"job-{response.json()['id']}")
    assert isinstance(recorded.payload, JobSubmitted)
    assert recorded.payload.spec == JobSpec.model_validate(SPEC)
