"""What no wait can fix, known when a job is submitted: a gang larger than its queue's ceiling,
or than the fleet could ever hold. The API answers these at once (422 problem+json, like an
unknown GPU type) instead of a 201 for a job admission would reject a moment later: `sbatch`
refuses a job no partition could run the same way.

The rules and their words are admission's own (`core.admission.capacity_rejection`), judged over
the admission catalogue the read models fold from the same events; admission judges them again
over the log. Nothing is judged while no node is known (admission then answers `no_nodes`).
Every node ever registered counts, lost or drained ones too: they may come back.
"""

from __future__ import annotations

from core.admission import capacity_rejection
from schemas.jobs import JobSpec
from services.api.problems import ProblemError
from services.api.projections.model import ReadModels


def capacity_problem(spec: JobSpec, models: ReadModels) -> ProblemError | None:
    """The 422 for a gang no wait can place (the first rule that applies), or None."""
    catalog = models.admission
    queue = spec.queue or spec.team
    if not catalog.nodes or queue not in catalog.queues:
        return None
    if spec.gpu_type is not None and spec.gpu_type not in catalog.gpu_types():
        return None  # the unknown GPU type is its own problem (validation.py)
    rejection = capacity_rejection(spec, catalog, catalog.queue_chain(queue))
    if rejection is None:
        return None
    code, reason = rejection
    return ProblemError(422, code.replace("_", "-"), reason)
