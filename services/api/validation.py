"""What the API can know is wrong with a submission before anything is written.

Checked against the read models (which may trail the log a little): admission re-checks the
same rules against the log when it decides, since the catalogue may change in between.
"""

from __future__ import annotations

from typing import Final

from core.admission import policy_violation
from core.mig import profile_names
from core.policy import DEFAULT_PRIORITY_CLASSES
from core.queue_rules import queue_owner
from schemas.jobs import JobSpec, illegal_env_names
from services.api.capacity import capacity_problem
from services.api.problems import ProblemError
from services.api.projections.model import ReadModels

PRIORITY_CLASSES: Final = frozenset(pc.name for pc in DEFAULT_PRIORITY_CLASSES)
# Jobs of this class run on idle capacity only: always preemptible.
IDLE_ONLY_PRIORITY: Final = "best-effort"
# Ten years. The scheduler plans starts and ends as timestamps: a runtime past any platform's
# clock (1e308 s) made every cycle fail on the reservation behind it. Checked here, not in
# JobSpec, so that the recorded event schemas stay as they are.
MAX_RUNTIME_S: Final = 10 * 366 * 86_400
_RUNTIME_FIELDS: Final = ("estimated_runtime_s", "max_runtime_s", "min_runtime_s")
# The scheduler counts CPUs in thousandths (core/shape.py): less than half of one rounded to
# none, and a CPU-only task that asks nothing packs without bound past every CPU ceiling.
# Checked here, not in JobSpec, so that the recorded event schemas stay as they are.
MIN_CPUS_PER_TASK: Final = 0.001


def invalid(slug: str, detail: str) -> ProblemError:
    return ProblemError(422, slug, detail)


def queue_chain(models: ReadModels, name: str) -> list[str]:
    """The queue and its ancestors, nearest first (a cycle stops the walk)."""
    chain: list[str] = []
    current: str | None = name
    while current is not None and current in models.queues and current not in chain:
        chain.append(current)
        current = models.queues[current].parent
    return chain


def check_submission(spec: JobSpec, models: ReadModels) -> None:
    """Raise the 4xx problem for the first thing wrong with `spec`, or return."""
    if spec.team not in models.teams:
        raise invalid("unknown-team", f"team {spec.team!r} does not exist")
    queue = spec.queue or spec.team
    # An unknown queue and another team's queue get the same answer: a team learns nothing
    # of other teams' queue names by trying them.
    if queue_owner(queue_chain(models, queue), models.teams) != spec.team:
        raise invalid("unknown-queue", f"queue {queue!r} is not a queue of team {spec.team!r}")
    if spec.priority not in PRIORITY_CLASSES:
        known = ", ".join(sorted(PRIORITY_CLASSES))
        raise invalid("unknown-priority", f"priority {spec.priority!r} is not one of: {known}")
    if spec.priority == IDLE_ONLY_PRIORITY and spec.preemptible is False:
        raise invalid(
            "not-preemptible", f"{IDLE_ONLY_PRIORITY} jobs run on idle capacity and are preemptible"
        )
    if spec.gpu_type is not None:
        types = {node.gpu_type for node in models.nodes.values()}
        if spec.gpu_type not in types:
            raise invalid(
                "unknown-gpu-type",
                f"no node has GPUs of type {spec.gpu_type!r} "
                f"(known: {', '.join(sorted(types)) or 'none'})",
            )
    if spec.mig_profile is not None:
        nodes = [
            node
            for node in models.nodes.values()
            if spec.gpu_type is None or node.gpu_type == spec.gpu_type
        ]
        offered = profile_names(node.gpu_model or node.gpu_type for node in nodes)
        if spec.mig_profile not in offered:
            raise invalid(
                "unknown-mig-profile",
                f"no GPU model of the cluster has the MIG profile {spec.mig_profile!r} "
                f"(profiles: {', '.join(sorted(offered)) or 'none'})",
            )
    for field in _RUNTIME_FIELDS:
        seconds = getattr(spec, field)
        if seconds is not None and seconds > MAX_RUNTIME_S:
            raise invalid("runtime-out-of-range", f"{field}: at most {MAX_RUNTIME_S} s (ten years)")
    if spec.max_runtime_s is not None and spec.min_runtime_s > spec.max_runtime_s:
        # A minimum runtime shields a gang from preemption; past its own end it would shield
        # the whole run, a non-preemptible job by another name.
        raise invalid(
            "runtime-out-of-range",
            f"min_runtime_s ({spec.min_runtime_s:g} s) must not exceed "
            f"max_runtime_s ({spec.max_runtime_s:g} s)",
        )
    if spec.cpus_per_task is not None and spec.cpus_per_task < MIN_CPUS_PER_TASK:
        raise invalid(
            "invalid-cpus",
            f"cpus_per_task: at least {MIN_CPUS_PER_TASK:g} (CPUs are counted in thousandths)",
        )
    for name in illegal_env_names(spec.env):
        raise invalid(
            "invalid-env",
            f"env: illegal environment variable name {name!r} "
            "(names must be non-empty, without '=' or NUL)",
        )
    known_secrets = models.tenancy.secrets.get(spec.team, set())
    for var, secret in sorted(spec.secret_env.items()):
        if secret not in known_secrets:
            raise invalid(
                "unknown-secret", f"secret_env.{var}: team {spec.team!r} has no secret {secret!r}"
            )
    violation = policy_violation(spec, models.tenancy.policy_of(spec.team))
    if violation is not None:
        code, reason = violation
        raise ProblemError(403, code.replace("_", "-"), reason)
    too_large = capacity_problem(spec, models)
    if too_large is not None:
        raise too_large
