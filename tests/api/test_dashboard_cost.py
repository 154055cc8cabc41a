"""The dashboard's queue reads only the jobs it shows (waiting, suspended, holding GPUs), from
the listing index: ended jobs, most of a long-lived read model, are never walked. A team's
dashboard stream redraws up to 20 times a second, 16 streams a team; each redraw used to walk
every job the log ever had."""

from __future__ import annotations

from typing import NoReturn

from schemas.jobs import JobAdmitted, JobCancelled
from services.api.auth import Principal
from services.api.projections.dashboard import snapshot
from services.api.projections.jobs import JobReadModel
from services.api.projections.model import ReadModels
from tests.api.builders import Log, submitted


class OnlyByKey(dict[str, JobReadModel]):
    """The jobs, answering lookups by id but refusing to be walked whole."""

    def values(self) -> NoReturn:
        raise AssertionError("every job walked")

    def items(self) -> NoReturn:
        raise AssertionError("every job walked")

    def __iter__(self) -> NoReturn:
        raise AssertionError("every job walked")


def test_the_queue_is_drawn_from_the_active_jobs_alone() -> None:
    log = Log()
    models = ReadModels()
    ended = [f"old{n}" for n in range(20)]
    models.apply_all(
        log.record(
            *(submitted(job_id, "vision") for job_id in ended),
            *(JobCancelled(job_id=job_id, reason="asked") for job_id in ended),
            submitted("nlp-wait", "nlp"),
            submitted("nlp-queued", "nlp"),
            JobAdmitted(job_id="nlp-queued", queue="nlp", priority="research"),
            submitted("vision-wait", "vision"),
        )
    )
    models.jobs = OnlyByKey(models.jobs)
    mine = snapshot(models, Principal(team="nlp"))["queue"]
    assert [job["id"] for job in mine["waiting"]] == ["nlp-wait", "nlp-queued"]
    everyone = snapshot(models, Principal(team=None))["queue"]
    assert [job["id"] for job in everyone["waiting"]] == ["nlp-wait", "nlp-queued", "vision-wait"]
    assert mine["running"] == everyone["running"] == []
