"""The REST request and response bodies: the API's own contract, apart from the event schemas.

The job spec is the one shared shape (DESIGN §5: the REST body and the CLI file are the spec).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from schemas.jobs import MAX_ARRAY_COUNT, NAME_PATTERN, JobSpec, JobState


class Body(BaseModel):
    """Request bodies reject unknown fields: a typo must not silently mean the default."""

    model_config = ConfigDict(extra="forbid")


class View(BaseModel):
    model_config = ConfigDict(frozen=True)


class JobCreatedView(View):
    id: str
    state: JobState
    array: list[str] | None = Field(
        default=None, description="an array's element ids (`ID_0` …); null for a single job"
    )


class JobView(View):
    id: str
    name: str
    team: str
    queue: str
    priority: str
    state: JobState
    reason: str | None
    reason_code: str | None
    estimated_start: datetime | None
    planned_nodes: list[str]
    placement: dict[str, list[int]] = Field(description="node id → GPU indices of the gang")
    attempts: int
    preemptions: int
    gpus: int
    tasks: int
    gpus_per_task: int
    requested: list[Literal["cancel", "suspend", "resume"]]
    submitted_at: datetime
    submitted_by: str
    updated_at: datetime
    finished_at: datetime | None
    spec: JobSpec
    held: bool = Field(default=False, description="held: never placed until released")
    array_id: str | None = Field(default=None, description="the array it is an element of")
    array_index: int | None = None


class ArrayView(View):
    """An array as a whole: what its id answers on GET and on cancel, suspend, resume,
    hold and release (which act on every element)."""

    id: str
    name: str
    team: str
    state: JobState = Field(description="the most advanced of its elements' states")
    count: int
    max_parallel: int | None
    array: list[str] = Field(description="the element ids, by index")
    states: dict[str, int] = Field(description="how many elements are in each state")
    elements: list[JobView]


class BatchSubmit(Body):
    jobs: list[JobSpec] = Field(min_length=1, max_length=MAX_ARRAY_COUNT)


class BatchCreatedView(View):
    jobs: list[JobCreatedView]


class JobPatch(Body):
    """What may change while a job waits; a field left out (or null) keeps its value."""

    priority: str | None = Field(default=None, pattern=NAME_PATTERN)
    estimated_runtime_s: float | None = Field(default=None, gt=0)
    max_runtime_s: float | None = Field(default=None, gt=0)
    max_retries: int | None = Field(default=None, ge=0, le=100)
    hold: bool | None = None


class JobPage(View):
    items: list[JobView]
    next: int | None = Field(description="pass as `after` for the next page; null on the last")


class EventView(View):
    position: int
    stream: str
    version: int
    event_id: str
    type: str
    schema_version: int
    recorded_at: datetime
    producer: str
    correlation_id: str | None
    causation_id: str | None
    epoch: int | None
    payload: dict[str, Any]


class EventList(View):
    items: list[EventView]


class EventPage(View):
    items: list[EventView]
    next: int = Field(description="pass as `after` to continue; the log only grows")
    has_more: bool


class SliceView(View):
    """One MIG instance of a GPU's geometry and who runs in it."""

    profile: str
    start: int = Field(description="start slot (memory slices)")
    free: bool
    job: str | None = Field(default=None, description="the job in it (only your own for teams)")


class ShareView(View):
    """One soft share of a GPU."""

    job: str | None = Field(default=None, description="the job (only your own for teams)")
    thousandths: int
    memory_mb: int | None
    sharing: Literal["mps", "timeslice"]


class GpuView(View):
    """What one GPU is doing: whole for a gang, cut into MIG instances, soft-shared, or idle."""

    index: int
    mode: Literal["idle", "whole", "mig", "shared", "unhealthy"]
    job: str | None = Field(default=None, description="the whole-GPU gang's job (own only)")
    geometry: list[SliceView] = Field(default_factory=list)
    shares: list[ShareView] = Field(default_factory=list)
    shared_thousandths: int = 0
    reconfiguring_until: datetime | None = Field(
        default=None, description="being re-partitioned: serves nothing until then"
    )


class NodeView(View):
    id: str
    hostname: str
    gpu_type: str
    rack: str
    block: str
    nvlink_domain: str
    nvlink: bool = Field(
        description="NVLink joins the node's GPUs; false: PCIe only, no tensor-parallel group "
        "of several GPUs goes there"
    )
    state: Literal["ready", "degraded", "draining", "drained", "lost"]
    gpus: int
    healthy_gpus: int
    allocated_gpus: int | float = Field(
        description="exact: a 1g slice of an H100 counts 1/7, a 0.25 share 1/4 (4 decimals)"
    )
    free_gpus: int
    unhealthy_gpu_indices: list[int]
    degraded_signals: list[str]
    reason: str | None
    labels: dict[str, str]
    jobs: dict[str, list[int]] = Field(description="job id → GPU indices (own jobs only for teams)")
    gpu_model: str | None = None
    mig: Literal["none", "dynamic", "fixed"] = "none"
    gpu_details: list[GpuView] = Field(
        default_factory=list, description="each GPU's geometry and what runs in each slice or share"
    )


class NodeList(View):
    items: list[NodeView]


class QueueView(View):
    name: str
    parent: str | None
    guaranteed_gpus: int
    max_gpus: int | None
    weight: float
    is_team: bool
    # Exact sums shown to 4 decimals where slices or shares make them fractional.
    allocated_gpus: int | float
    borrowed_gpus: int | float
    pending_jobs: int
    running_jobs: int
    max_cpus: int | None = Field(default=None, description="CPU ceiling of the subtree; null: none")
    max_memory_mb: int | None = Field(default=None, description="memory ceiling; null: none")
    allocated_cpus: float = Field(default=0.0, description="CPUs the subtree's gangs hold now")
    allocated_memory_mb: int = Field(default=0, description="memory the subtree's gangs hold")


class QueueList(View):
    items: list[QueueView]


class ClusterView(View):
    nodes: int
    nodes_by_state: dict[str, int]
    total_gpus: int
    healthy_gpus: int
    allocated_gpus: int | float
    free_gpus: int
    whole_free_nodes: int
    fragmentation: float = Field(description="share of free GPUs not in wholly free nodes")
    utilization: float = Field(description="allocated over healthy GPUs")
    pending_jobs: int
    pending_by_class: dict[str, int]
    running_jobs: int


class QuotaBody(Body):
    parent: str | None = Field(default=None, pattern=NAME_PATTERN)
    guaranteed_gpus: int = Field(default=0, ge=0, le=10_000_000)
    max_gpus: int | None = Field(default=None, ge=0, le=10_000_000)

    @model_validator(mode="after")
    def _max_covers_guarantee(self) -> QuotaBody:
        if self.max_gpus is not None and self.max_gpus < self.guaranteed_gpus:
            raise ValueError("max_gpus must be at least guaranteed_gpus")
        return self


class TeamCreate(QuotaBody):
    name: str = Field(pattern=NAME_PATTERN)


class TeamCreatedView(View):
    name: str
    queue: str
    token: str = Field(description="shown once; only its sha256 is recorded")


class TeamView(View):
    name: str
    parent: str | None
    queue: str
    guaranteed_gpus: int = Field(description="of the team's queue, as configured now")
    max_gpus: int | None = Field(description="the borrowing ceiling; null: none")
    # Exact, as a queue's: a slice or share counts its fraction of a GPU.
    allocated_gpus: int | float
    borrowed_gpus: int | float = Field(description="allocated beyond the guarantee")
    running_jobs: int
    pending_jobs: int
    created_at: datetime


class TeamList(View):
    items: list[TeamView]


class QueueConfig(QuotaBody):
    weight: float = Field(default=1.0, gt=0, le=1_000_000)
    max_cpus: int | None = Field(
        default=None, ge=0, le=100_000_000, description="CPU ceiling of the subtree; null: none"
    )
    max_memory_mb: int | None = Field(
        default=None, ge=0, le=10**12, description="memory ceiling of the subtree; null: none"
    )


class TeamPolicyBody(Body):
    """A team's policy, a whole value: a field left out takes its default."""

    allowed_priority_classes: list[str] | None = Field(
        default=None,
        max_length=64,
        description="the priority classes the team may use; null: all but inference-critical",
    )
    non_preemptible_allowed: bool = False
    max_pending_jobs: int | None = Field(default=None, ge=0, le=10_000_000)
    submissions_per_second: float | None = Field(default=None, gt=0, le=1_000_000)
    jobs_per_second: float | None = Field(
        default=None,
        gt=0,
        le=1_000_000,
        description="jobs the team may submit a second, each job of a batch or an array counted",
    )


class TeamPolicyView(View):
    team: str
    allowed_priority_classes: list[str]
    non_preemptible_allowed: bool
    max_pending_jobs: int | None
    submissions_per_second: float | None
    jobs_per_second: float | None
    pending_jobs: int


class TokenCreate(Body):
    name: str = Field(pattern=NAME_PATTERN, description="who will use it: a person or a robot")


class TokenCreatedView(View):
    id: str
    name: str
    token: str = Field(description="shown once; only its sha256 is recorded")


class TokenView(View):
    id: str
    name: str
    revoked: bool


class TokenList(View):
    items: list[TokenView]


class SecretBody(Body):
    value: str = Field(min_length=1, max_length=32_768)


class SecretView(View):
    team: str
    name: str


class SecretList(View):
    items: list[str] = Field(description="the names of the team's secrets (never the values)")


class QueuePatch(Body):
    """Only the fields given change; `"max_gpus": null` makes the ceiling unlimited."""

    parent: str | None = Field(default=None, pattern=NAME_PATTERN)
    guaranteed_gpus: int | None = Field(default=None, ge=0, le=10_000_000)
    max_gpus: int | None = Field(default=None, ge=0, le=10_000_000)
    weight: float | None = Field(default=None, gt=0, le=1_000_000)
    max_cpus: int | None = Field(default=None, ge=0, le=100_000_000)
    max_memory_mb: int | None = Field(default=None, ge=0, le=10**12)


class DrainBody(Body):
    reason: str = Field(default="drained by an operator", min_length=1, max_length=500)
    deadline: datetime | None = Field(
        default=None,
        description="running gangs may go on until then; they are checkpointed and moved after",
    )


class Health(View):
    status: Literal["ok", "unavailable"]
    detail: dict[str, Any] = Field(default_factory=dict)
