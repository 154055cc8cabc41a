"""The cycle builds its JobDeferred and its whole-GPU GangReserved without pydantic's
constructor (core/built_events.py): for any input, each is the one `model_construct` builds,
equal, hashed, serialised and folded alike."""

from __future__ import annotations

from typing import get_args

from hypothesis import given
from hypothesis import strategies as st

from core.built_events import gang_reserved, job_deferred, rank_placement
from schemas.jobs import GangReserved, JobDeferred, RankPlacement
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


_ranks = st.lists(
    st.tuples(
        st.integers(min_value=0, max_value=4_095),
        st.text(min_size=1, max_size=40),
        st.lists(st.integers(min_value=0, max_value=15), max_size=16, unique=True),
    ),
    min_size=1,
    max_size=8,
)


@given(
    job_id=st.text(min_size=1, max_size=64),
    attempt=st.integers(min_value=1, max_value=1_000),
    ranks=_ranks,
    interval=st.none() | st.floats(min_value=1.0, max_value=1e7),
)
def test_the_binding_event_is_the_one_pydantic_builds(
    job_id: str,
    attempt: int,
    ranks: list[tuple[int, str, list[int]]],
    interval: float | None,
) -> None:
    built = gang_reserved(
        job_id, attempt, [rank_placement(r, node, list(gpus)) for r, node, gpus in ranks], interval
    )
    expected = GangReserved.model_construct(
        job_id=job_id,
        attempt=attempt,
        ranks=[
            RankPlacement.model_construct(rank=r, node_id=node, gpus=list(gpus))
            for r, node, gpus in ranks
        ],
        checkpoint_interval_s=interval,
    )

    assert type(built) is GangReserved
    assert built == expected
    assert built.model_fields_set == expected.model_fields_set
    for mine, theirs in zip(built.ranks, expected.ranks, strict=True):
        assert type(mine) is RankPlacement
        assert mine == theirs
        assert mine.model_fields_set == theirs.model_fields_set
    assert built.model_dump() == expected.model_dump()
    assert built.model_dump_json() == expected.model_dump_json()
    assert built.stream == expected.stream
    assert GangReserved.model_validate(built.model_dump()) == expected
