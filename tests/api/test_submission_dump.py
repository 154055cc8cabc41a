"""A single submission dumps its JobSubmitted once, before its checks, and the log stores that
JSON (services/api/commands.py `_submitted_payload`): what the log cannot hold is refused as
before, first and in the same words. A batch dumps each spec once, in its check, and writes
each JobSubmitted's JSON around it (`_submitted_json`): the same bytes as the event's dump."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.jobs import JobSpec, JobSubmitted
from services.api.commands import _require_storable, _submitted_json, _submitted_payload
from services.api.problems import ProblemError
from services.runtime import EventStore
from services.runtime.records import StreamAppend
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


# Any text JSON can carry (no lone surrogates, which no dump writes), quotes, backslashes,
# control and non-ASCII characters included.
TEXT = st.text(st.characters(exclude_categories=["Cs"]), max_size=12)


@settings(max_examples=200, deadline=None)
@given(
    job_id=TEXT.filter(lambda text: 1 <= len(text) <= 64),
    by=TEXT,
    env=st.dictionaries(TEXT, TEXT, max_size=3),
    command=st.lists(TEXT, min_size=1, max_size=3),
    element=st.none()
    | st.tuples(st.from_regex(r"[A-Za-z0-9._-]{1,12}", fullmatch=True), st.integers(0, 999)),
    share=st.booleans(),
)
def test_a_submitted_event_written_around_its_spec_s_json_is_its_own_dump(
    job_id: str,
    by: str,
    env: dict[str, str],
    command: list[str],
    element: tuple[str, int] | None,
    share: bool,
) -> None:
    spec = JobSpec.model_validate(
        {
            **SPEC,
            "env": env,
            "command": command,
            # A share's spec is written without its gpus_per_task (its serializer's own rule).
            **({"gpus_per_task": 0, "gpu_fraction": 0.25} if share else {}),
        }
    )
    event = JobSubmitted(
        job_id=job_id,
        spec=spec,
        submitted_by=by,
        array_id=None if element is None else element[0],
        array_index=None if element is None else element[1],
    )
    assert _submitted_json(event, spec.model_dump_json()) == event.model_dump_json()


@pytest.mark.integration
async def test_a_batch_dumps_each_spec_once_and_writes_each_event_s_own_json(
    api: Api, store: EventStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    await api.create_team("nlp")
    dumps: list[str] = []
    originals = {model: model.model_dump_json for model in (JobSpec, JobSubmitted)}
    for model, original in originals.items():

        def counted(self: Any, *args: Any, __original: Any = original, **kw: Any) -> str:
            dumps.append(type(self).__name__)
            text: str = __original(self, *args, **kw)
            return text

        monkeypatch.setattr(model, "model_dump_json", counted)
    written: list[StreamAppend] = []
    append_many = EventStore.append_many

    async def recorded(self: EventStore, appends: Any, *args: Any, **kw: Any) -> Any:
        written.extend(appends)
        return await append_many(self, appends, *args, **kw)

    monkeypatch.setattr(EventStore, "append_many", recorded)
    jobs = [
        {**SPEC, "name": "a", "env": {"NOTE": 'é \\ " \u2028'}},
        {**SPEC, "name": "b", "array": {"count": 3}},
        # Its dependency is resolved into a copy of its spec, which its check did not dump:
        # its event is dumped whole.
        {**SPEC, "name": "c", "depends_on": [{"job": "a"}]},
    ]
    response = await api.client.post(
        "/v1/jobs:batch", json={"jobs": jobs}, headers=api.teams["nlp"]
    )
    assert response.status_code == 201, response.text
    assert dumps == ["JobSpec"] * 3 + ["JobSubmitted"]
    submitted = [append for append in written if append.events]
    assert len(submitted) == 5
    for append in submitted:
        [event] = append.events
        assert isinstance(event, JobSubmitted)
        assert append.payloads == (originals[JobSubmitted](event),)
    [recorded_c] = await store.read_stream(submitted[-1].stream)
    assert isinstance(recorded_c.payload, JobSubmitted)
    assert recorded_c.payload == submitted[-1].events[0]
