"""`gangway why`: the lines it prints for a job, from the API's answer."""

from __future__ import annotations

from typing import Any

from gangway.commands.why import explain


def job(**fields: Any) -> dict[str, Any]:
    return {
        "id": "6c8ad786e9c0",
        "state": "queued",
        "reason": "needs 64 GPUs (8 tasks x 8); queue nlp would exceed its ceiling of 64 GPUs",
        "reason_code": "quota_ceiling",
        "estimated_start": None,
        "planned_nodes": [],
        "placement": {},
        "requested": [],
        **fields,
    }


def test_a_waiting_job_without_a_plan_is_not_promised_one() -> None:
    # "estimated start: not planned yet" read as a plan to come, for a job that waits on its
    # queue's ceiling and is planned nothing until it is first in line for GPUs.
    assert explain(job()) == [
        "job 6c8ad786e9c0 is queued",
        "reason: needs 64 GPUs (8 tasks x 8); queue nlp would exceed its ceiling of 64 GPUs "
        "[quota_ceiling]",
        "estimated start: none (only the job first in line for GPUs gets one)",
    ]


def test_a_running_job_has_no_estimated_start_line() -> None:
    lines = explain(job(state="running", reason=None, placement={"n0000": [0, 1]}))
    assert lines[0] == "job 6c8ad786e9c0 is running"
    assert not any(line.startswith("estimated start") for line in lines)
