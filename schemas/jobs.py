"""The job spec and the events of a job's life: submission, admission, placement, outcome."""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import datetime
from typing import Annotated, Any, Literal, get_args

from pydantic import (
    Field,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
    model_validator,
)

from schemas.base import Event, Message
from schemas.reasons import (
    DeferCodeField,
    PreemptCodeField,
    RejectCodeField,
    RequeueCodeField,
)

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$"
MAX_GANG_TASKS = 4096
MAX_GPUS_PER_TASK = 64
# A variable name a rank's environment can hold (secret_env's keys).
ENV_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]{0,127}$"

# A MIG profile name as NVIDIA writes it without the "MIG " prefix: 1g.10gb, 3g.40gb, 1g.10gb+me.
MIG_PROFILE_PATTERN = r"^[1-8]g\.[0-9]{1,3}gb(\+me)?$"
MAX_CPUS_PER_TASK = 1024
SharingMode = Literal["mps", "timeslice"]
PositiveSeconds = Annotated[float, Field(gt=0)]

RequiredLocality = Literal["node", "rack", "block", "none"]
PreferredLocality = Literal["rack", "block", "none"]


class TopologySpec(Message):
    """Where the gang's ranks may land.

    `tp_size` GPUs form one tensor-parallel group that never spans NVLink domains; it either
    divides `gpus_per_task` or is a multiple of it (then that many consecutive ranks share a node).
    """

    tp_size: int | None = Field(default=None, ge=1, le=MAX_GPUS_PER_TASK)
    require: RequiredLocality = "none"
    prefer: PreferredLocality = "none"


class CheckpointSpec(Message):
    """Periodic checkpoints: every `interval_s` seconds of a gang's run, or `auto`: the
    Young-Daly interval from the job's measured checkpoint cost and the failure rate seen on
    its kind of node (core/checkpointing.py), chosen when each gang starts; None: only the
    checkpoints a preemption or a drain asks for."""

    interval_s: PositiveSeconds | Literal["auto"] | None = None


# ---- pipelines and arrays (DESIGN §8 "Running jobs like people do")

JOB_ID_PATTERN = r"^[A-Za-z0-9._-]{1,64}$"
# How many jobs one array may hold, and how many dependencies one job may name: bounds that
# keep one request from flooding the log (a team's pending cap applies on top).
MAX_ARRAY_COUNT = 1000
MAX_DEPENDENCIES = 64
# Slurm's afterok / afterany / afternotok.
DependencyCondition = Literal["succeeded", "finished", "failed"]


class Dependency(Message):
    """Start only once job `job` ended as `condition` says: `succeeded`, `finished` (any
    terminal state) or `failed`. In a batch or a multi-document file, `job` may also be the
    `name` of another job of the same request."""

    job: str = Field(pattern=JOB_ID_PATTERN)
    condition: DependencyCondition = "succeeded"


class ArraySpec(Message):
    """`count` jobs sharing one spec (elements `ID_0` … `ID_{count-1}`), at most
    `max_parallel` of them holding GPUs at once (None: no limit of its own)."""

    count: int = Field(ge=1, le=MAX_ARRAY_COUNT)
    max_parallel: int | None = Field(default=None, ge=1, le=MAX_ARRAY_COUNT)


def illegal_env_names(env: Mapping[str, str]) -> list[str]:
    """Names no process environment can hold (empty, with `=` or NUL): a spec with one can
    never launch, however often it is retried. The API refuses them at submit; the agent
    fails a spec recorded before that rule with a permanent launch failure."""
    return sorted(name for name in env if not name or "=" in name or "\0" in name)


class JobSpec(Message):
    """What a user submits (REST body and CLI file)."""

    name: str = Field(pattern=NAME_PATTERN)
    team: str = Field(pattern=NAME_PATTERN)
    queue: str | None = Field(default=None, pattern=NAME_PATTERN)
    priority: str = Field(default="research", pattern=NAME_PATTERN)
    gpu_type: str | None = Field(default=None, min_length=1, max_length=64)
    tasks: int = Field(default=1, ge=1, le=MAX_GANG_TASKS)
    # Whole GPUs per task; 0 for a CPU-only task. A slice or share task (`mig_profile`,
    # `gpu_fraction`) touches exactly one GPU: its gpus_per_task is 1 (given as 0 or left out).
    gpus_per_task: int = Field(default=1, ge=0, le=MAX_GPUS_PER_TASK)
    # One MIG slice of this profile per task (hardware isolation).
    mig_profile: str | None = Field(default=None, pattern=MIG_PROFILE_PATTERN)
    # A share of one GPU per task, in thousandths (soft isolation), enforced by `sharing`.
    gpu_fraction: float | None = Field(default=None, gt=0, lt=1)
    sharing: SharingMode | None = None
    gpu_memory_mb: int | None = Field(default=None, ge=1, le=1_048_576)
    cpus_per_task: float | None = Field(default=None, gt=0, le=MAX_CPUS_PER_TASK)
    memory_mb_per_task: int | None = Field(default=None, ge=1, le=16_777_216)
    # What each task may hold in its working directory on its node (its output included):
    # the agent stops a rank past it and the job fails (services/agent/disk.py). None: the
    # agent's default; never more than the operator's cap.
    disk_mb_per_task: int | None = Field(default=None, ge=1, le=16_777_216)
    min_tasks: int | None = Field(default=None, ge=1, le=MAX_GANG_TASKS)
    topology: TopologySpec = TopologySpec()
    command: list[str] = Field(default_factory=lambda: ["true"], min_length=1, max_length=256)
    env: dict[str, str] = Field(default_factory=dict, max_length=256)
    estimated_runtime_s: float | None = Field(default=None, gt=0)
    max_runtime_s: float | None = Field(default=None, gt=0)
    preemptible: bool | None = None
    min_runtime_s: float = Field(default=0, ge=0)
    checkpoint: CheckpointSpec = CheckpointSpec()
    max_retries: int = Field(default=3, ge=0, le=100)
    # VAR -> the name of one of the team's secrets; the agent puts its value in the rank's
    # environment at launch, so that no secret value is ever part of the spec or the log.
    secret_env: dict[str, str] = Field(default_factory=dict, max_length=64)
    depends_on: list[Dependency] = Field(default_factory=list, max_length=MAX_DEPENDENCIES)
    array: ArraySpec | None = None
    # Submitted held: never placed until released (POST /v1/jobs/{id}/release).
    hold: bool = False

    @field_validator("secret_env")
    @classmethod
    def _secret_env_names(cls, secret_env: dict[str, str]) -> dict[str, str]:
        for var, secret in secret_env.items():
            if not re.fullmatch(ENV_NAME_PATTERN, var) or var.startswith("GANGWAY_"):
                raise ValueError(f"secret_env: {var!r} is not a variable a job may set")
            if not re.fullmatch(NAME_PATTERN, secret):
                raise ValueError(f"secret_env: {secret!r} is not a secret name")
        return secret_env

    @field_validator("command")
    @classmethod
    def _command_args_bounded(cls, command: list[str]) -> list[str]:
        if any(len(arg) > 4096 for arg in command):
            raise ValueError("each command argument must be at most 4096 characters")
        return command

    @model_validator(mode="before")
    @classmethod
    def _one_gpu_per_slice_task(cls, data: Any) -> Any:
        """A slice or share task touches one GPU, and a share is enforced by MPS unless told
        otherwise: both are written into the spec, so that every reader sees the same job."""
        if not isinstance(data, dict):
            return data
        fractional = data.get("mig_profile") is not None or data.get("gpu_fraction") is not None
        if not fractional:
            return data
        whole = data.get("gpus_per_task")
        # A boolean is no count of GPUs (strict JSON): refused here, before it is overwritten.
        if whole is not None and (whole != 0 or isinstance(whole, bool)):
            raise ValueError(
                "a job asks exactly one of whole GPUs (gpus_per_task), a MIG slice "
                "(mig_profile) or a GPU share (gpu_fraction)"
            )
        data = {**data, "gpus_per_task": 1}
        if data.get("gpu_fraction") is not None and data.get("sharing") is None:
            data["sharing"] = "mps"
        return data

    @model_serializer(mode="wrap")
    def _slice_tasks_name_no_whole_gpus(self, handler: SerializerFunctionWrapHandler) -> Any:
        """A slice or share job is written without gpus_per_task (its 1 is implied): what is
        recorded reads back as what was submitted, under the same exactly-one-of rule."""
        data = handler(self)
        if isinstance(data, dict) and self.fractional:
            data.pop("gpus_per_task", None)
        return data

    @field_validator("gpu_fraction")
    @classmethod
    def _fraction_in_thousandths(cls, fraction: float | None) -> float | None:
        if fraction is not None and (
            abs(fraction * 1000 - round(fraction * 1000)) > 1e-6 or round(fraction * 1000) < 1
        ):
            # Under a thousandth rounds to a share of nothing, which would pack without bound.
            raise ValueError("gpu_fraction is given in thousandths (e.g. 0.25, 0.125)")
        return fraction

    @model_validator(mode="after")
    def _resources_are_consistent(self) -> JobSpec:
        if self.mig_profile is not None and self.gpu_fraction is not None:
            raise ValueError(
                "a job asks exactly one of whole GPUs (gpus_per_task), a MIG slice "
                "(mig_profile) or a GPU share (gpu_fraction)"
            )
        if self.gpu_fraction is None and self.sharing is not None:
            raise ValueError("sharing applies to a gpu_fraction job only")
        if self.gpu_fraction is None and self.gpu_memory_mb is not None:
            raise ValueError(
                "gpu_memory_mb applies to a gpu_fraction job only (a MIG profile fixes its memory)"
            )
        if self.gpus_per_task == 0 and self.cpus_per_task is None:
            raise ValueError("a CPU-only task (gpus_per_task: 0) must give cpus_per_task")
        if self.topology.tp_size is not None and (self.fractional or self.gpus_per_task == 0):
            raise ValueError("topology.tp_size applies to jobs of whole GPUs only")
        return self

    @model_validator(mode="after")
    def _shape_is_consistent(self) -> JobSpec:
        if self.min_tasks is not None and self.min_tasks > self.tasks:
            raise ValueError("min_tasks must not exceed tasks")
        tp = self.topology.tp_size
        if tp is not None and self.gpus_per_task > 0:
            if tp % self.gpus_per_task and self.gpus_per_task % tp:
                raise ValueError("topology.tp_size must divide gpus_per_task or be a multiple")
            if (self.tasks * self.gpus_per_task) % tp:
                raise ValueError("the gang's GPUs must be a whole number of tp_size groups")
        if (
            self.max_runtime_s is not None
            and self.estimated_runtime_s is not None
            and self.estimated_runtime_s > self.max_runtime_s
        ):
            raise ValueError("estimated_runtime_s must not exceed max_runtime_s")
        if self.env.keys() & self.secret_env.keys():
            raise ValueError("a variable is either in env or in secret_env, not both")
        return self

    @property
    def gang_min_tasks(self) -> int:
        return self.tasks if self.min_tasks is None else self.min_tasks

    @property
    def total_gpus(self) -> int:
        return self.tasks * self.gpus_per_task

    @property
    def fractional(self) -> bool:
        """The job asks a MIG slice or a GPU share per task, not whole GPUs."""
        return self.mig_profile is not None or self.gpu_fraction is not None

    @property
    def gpu_thousandths(self) -> int:
        """A share task's fraction of its GPU in thousandths (exact; 0 for other jobs)."""
        return 0 if self.gpu_fraction is None else round(self.gpu_fraction * 1000)


def array_element_id(array_id: str, index: int) -> str:
    """An array element's job id, named as Slurm names array tasks: `ID_3`."""
    return f"{array_id}_{index}"


def job_stream(job_id: str) -> str:
    """The log stream of a job's events."""
    return f"job-{job_id}"


class JobEvent(Event):
    job_id: str = Field(min_length=1, max_length=64)

    @property
    def stream(self) -> str:
        return job_stream(self.job_id)


class JobSubmitted(JobEvent):
    type = "JobSubmitted"
    spec: JobSpec
    submitted_by: str
    # An element of an array: the array's id and this element's index (job id `ID_INDEX`).
    array_id: str | None = Field(default=None, pattern=JOB_ID_PATTERN)
    array_index: int | None = Field(default=None, ge=0, lt=MAX_ARRAY_COUNT)


class JobAdmitted(JobEvent):
    """Admission accepted the job into `queue` at `priority` (both resolved from the spec)."""

    type = "JobAdmitted"
    queue: str
    priority: str


class JobRejected(JobEvent):
    type = "JobRejected"
    code: RejectCodeField
    reason: str


class JobCancelRequested(JobEvent):
    type = "JobCancelRequested"
    by: str


class JobSuspendRequested(JobEvent):
    type = "JobSuspendRequested"
    by: str


class JobResumeRequested(JobEvent):
    type = "JobResumeRequested"
    by: str


class JobDeferred(JobEvent):
    """The job stays waiting, for the reason given; recorded only when the reason changes."""

    type = "JobDeferred"
    code: DeferCodeField
    message: str


class ReservationPlanned(JobEvent):
    """The head gang's earliest start on concrete nodes; backfill may not delay it."""

    type = "ReservationPlanned"
    start_at: datetime
    nodes: list[str]
    # The clock of the cycle that planned it, by which that cycle placed every job behind the
    # head (does it end by `start_at`?). The log's recorded time is when the cycle's events
    # committed, a moment later. None in events recorded before it was (additive: the auditor
    # then judges at the recorded time).
    decided_at: datetime | None = None


class MigSlice(Message):
    """The MIG instance a slice task runs in, on the one GPU of its `gpus`."""

    profile: str
    start: int = Field(ge=0, le=7)


class GpuShare(Message):
    """A share task's part of the one GPU of its `gpus`: compute in thousandths, memory."""

    thousandths: int = Field(ge=1, le=999)
    memory_mb: int | None = Field(default=None, ge=1)
    sharing: SharingMode


class RankPlacement(Message):
    rank: int = Field(ge=0)
    node_id: str
    gpus: list[int]
    # A slice or share task holds part of its one GPU (neither: the whole GPUs of `gpus`).
    mig: MigSlice | None = None
    share: GpuShare | None = None


class GangReserved(JobEvent):
    """Every rank of the gang is bound to its GPUs, at once: the only event that binds GPUs."""

    type = "GangReserved"
    attempt: int = Field(ge=1)
    ranks: list[RankPlacement] = Field(min_length=1)
    # The attempt's periodic checkpoint interval: the spec's, or the one the scheduler chose
    # for `checkpoint: {interval_s: auto}` (recorded so that it is auditable; the agent tells
    # the ranks, the checkpoint service requests by it). None: no periodic checkpoints, or a
    # gang reserved before intervals were recorded (the spec then says).
    checkpoint_interval_s: float | None = Field(default=None, gt=0)


class TaskStarted(JobEvent):
    type = "TaskStarted"
    attempt: int = Field(ge=1)
    rank: int = Field(ge=0)
    node_id: str


class TaskExited(JobEvent):
    type = "TaskExited"
    attempt: int = Field(ge=1)
    rank: int = Field(ge=0)
    node_id: str
    exit_code: int
    reason: str | None = None
    # Trying again would fail the same way: the rank never started (a bad spec, a missing
    # program), or it broke a limit of its spec that the next attempt would break again (its
    # disk): the retry policy fails the job at once instead of crash-looping it.
    permanent: bool = False
    # The kernel's OOM killer ended the rank (its agent saw the OOM-kill count of the rank's
    # memory cgroup, or of the host without one, rise as it died of SIGKILL): the retry policy
    # fails a job that runs out of memory twice at the same size (core/retry.py).
    out_of_memory: bool = False


class PreemptionRequested(JobEvent):
    """Checkpoint, then evict, within `grace_s`; the gang is released by JobRequeued."""

    type = "PreemptionRequested"
    attempt: int = Field(ge=1)
    preemptor_job_id: str | None
    reason: str
    grace_s: float = Field(ge=0)
    # On which grounds (schemas/reasons.py); None in events recorded before codes were given.
    code: PreemptCodeField | None = None


class JobRequeued(JobEvent):
    """The gang of `attempt` is released whole and the job waits again for a new attempt."""

    type = "JobRequeued"
    attempt: int = Field(ge=1)
    code: RequeueCodeField
    reason: str


class JobSuspended(JobEvent):
    type = "JobSuspended"
    attempt: int | None = None


class JobResumed(JobEvent):
    type = "JobResumed"


class JobSucceeded(JobEvent):
    type = "JobSucceeded"
    attempt: int = Field(ge=1)


class JobFailed(JobEvent):
    type = "JobFailed"
    attempt: int | None = None
    reason: str


class JobCancelled(JobEvent):
    type = "JobCancelled"
    attempt: int | None = None
    reason: str


class JobHeld(JobEvent):
    """The job is held: it stays waiting (reason `held`) and is never placed until released."""

    type = "JobHeld"
    by: str


class JobHoldReleased(JobEvent):
    """The hold is lifted; the job waits for a gang again (its aging clock restarts)."""

    type = "JobHoldReleased"
    by: str


class JobChanges(Message):
    """What may change while a job waits (PATCH /v1/jobs/{id}); null means unchanged."""

    priority: str | None = Field(default=None, pattern=NAME_PATTERN)
    estimated_runtime_s: float | None = Field(default=None, gt=0)
    max_runtime_s: float | None = Field(default=None, gt=0)
    max_retries: int | None = Field(default=None, ge=0, le=100)

    def applied_to(self, spec: JobSpec) -> JobSpec:
        """The spec with these changes (validated again: max ≥ estimate and the rest)."""
        changed = {name: value for name, value in self if value is not None}
        return JobSpec.model_validate({**spec.model_dump(), **changed})


class JobUpdated(JobEvent):
    """A waiting job's spec was changed by its team (validated as a submission would be)."""

    type = "JobUpdated"
    by: str
    changes: JobChanges


JOB_EVENTS: tuple[type[Event], ...] = (
    JobSubmitted,
    JobAdmitted,
    JobRejected,
    JobCancelRequested,
    JobSuspendRequested,
    JobResumeRequested,
    JobDeferred,
    ReservationPlanned,
    GangReserved,
    TaskStarted,
    TaskExited,
    PreemptionRequested,
    JobRequeued,
    JobSuspended,
    JobResumed,
    JobSucceeded,
    JobFailed,
    JobCancelled,
    JobHeld,
    JobHoldReleased,
    JobUpdated,
)

# The events after which a job is terminal: nothing decides anything for it again.
JOB_ENDING_EVENTS: tuple[type[JobEvent], ...] = (JobSucceeded, JobFailed, JobCancelled, JobRejected)

# The events after which the attempt's gang no longer holds any GPU.
GANG_RELEASING_EVENTS: tuple[type[JobEvent], ...] = (
    JobRequeued,
    JobSuspended,
    JobSucceeded,
    JobFailed,
    JobCancelled,
)


# The job states users see (DESIGN §5), in lifecycle order; every service speaks these words.
JobState = Literal[
    "pending",
    "queued",
    "reserved",
    "running",
    "preempting",
    "suspended",
    "succeeded",
    "failed",
    "cancelled",
    "rejected",
]
JOB_STATES: tuple[JobState, ...] = get_args(JobState)
TERMINAL_STATES: frozenset[JobState] = frozenset({"succeeded", "failed", "cancelled", "rejected"})
WAITING_STATES: frozenset[JobState] = frozenset({"pending", "queued"})
# The states in which the job's current gang holds GPUs.
HOLDING_STATES: frozenset[JobState] = frozenset({"reserved", "running", "preempting"})
