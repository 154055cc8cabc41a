"""Drawn job ids: 12 random lowercase hex digits, the shape every reader of a drawn id expects."""

from __future__ import annotations

from services.api.commands import JOB_ID_HEX, new_job_id
from services.api.pipelines import DRAWN_JOB_ID


def test_a_drawn_job_id_is_twelve_random_hex_digits() -> None:
    drawn = [new_job_id() for _ in range(2000)]
    assert all(len(job_id) == JOB_ID_HEX == 12 for job_id in drawn)
    assert all(DRAWN_JOB_ID.fullmatch(job_id) for job_id in drawn)
    assert len(set(drawn)) == len(drawn)
    # Every digit varies (a uuid4's fixed version digit, its 13th, is not among them).
    assert all(len({job_id[i] for job_id in drawn}) == 16 for i in range(JOB_ID_HEX))
