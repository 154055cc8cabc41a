"""Events the cycle builds by the thousand, at the cost of a dict.

A busy cycle where a new head's reservation holds the GPUs just freed records a new reason for
~9,000 waiting jobs at once, and one that binds a 4,096-GPU gang builds 512 rank placements;
pydantic's unvalidated path (`model_construct`) cost ~3 to 4 µs per object there, the most of
that cycle's explain phase and of its bindings. The core builds these from values it produced
itself, so each is filled with exactly the slots `model_construct` fills (the given fields in
the fields set, the defaults of the others in field order, no extra, no private attributes),
and nothing else: tests/core compare the two for any input.
"""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel

from schemas.jobs import GangReserved, JobDeferred, RankPlacement
from schemas.reasons import DeferCode

_new = object.__new__
_set = object.__setattr__
_Model = TypeVar("_Model", bound=BaseModel)


def _built(cls: type[_Model], values: dict[str, Any], given: set[str]) -> _Model:
    """`cls.model_construct(**given values)` for a model without extra or private attributes,
    `values` holding every field in field order (defaults for those not `given`)."""
    event: _Model = _new(cls)
    _set(event, "__dict__", values)
    _set(event, "__pydantic_fields_set__", given)
    _set(event, "__pydantic_extra__", None)
    _set(event, "__pydantic_private__", None)
    return event


def job_deferred(job_id: str, code: DeferCode, message: str) -> JobDeferred:
    """`JobDeferred.model_construct(job_id=…, code=…, message=…)`, cheaper."""
    return _built(
        JobDeferred,
        {"job_id": job_id, "code": code, "message": message},
        {"job_id", "code", "message"},
    )


def rank_placement(rank: int, node_id: str, gpus: list[int]) -> RankPlacement:
    """`RankPlacement.model_construct(rank=…, node_id=…, gpus=…)` (whole GPUs: no slice or
    share), cheaper."""
    return _built(
        RankPlacement,
        {"rank": rank, "node_id": node_id, "gpus": gpus, "mig": None, "share": None},
        {"rank", "node_id", "gpus"},
    )


def gang_reserved(
    job_id: str, attempt: int, ranks: list[RankPlacement], checkpoint_interval_s: float | None
) -> GangReserved:
    """`GangReserved.model_construct(job_id=…, attempt=…, ranks=…, checkpoint_interval_s=…)`,
    cheaper."""
    return _built(
        GangReserved,
        {
            "job_id": job_id,
            "attempt": attempt,
            "ranks": ranks,
            "checkpoint_interval_s": checkpoint_interval_s,
        },
        {"job_id", "attempt", "ranks", "checkpoint_interval_s"},
    )
