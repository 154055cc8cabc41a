"""Node inventory and health: registration, loss, degradation, draining."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import Field

from schemas.base import Event, Message

# How a node's GPUs may be partitioned: never (whole GPUs and soft shares), by the scheduler
# (`dynamic`: it decides each idle GPU's geometry), or a geometry fixed by the cluster spec.
MigMode = Literal["none", "dynamic", "fixed"]
DEFAULT_RECONFIGURE_S = 60.0

HealthSignal = Literal["thermal", "ecc", "xid", "nic", "straggler", "heartbeat", "manual"]


class GpuInfo(Message):
    index: int = Field(ge=0)
    uuid: str
    model: str
    memory_mb: int = Field(ge=0)


class NodeEvent(Event):
    node_id: str = Field(min_length=1, max_length=128)

    @property
    def stream(self) -> str:
        return f"node-{self.node_id}"


class NodeRegistered(NodeEvent):
    """A node joined (or re-registered) with its GPUs and its place in the topology.

    `nvlink_domain` defaults to the node itself; the topology is node ⊂ rack ⊂ block ⊂ cluster.
    `nvlink` says whether the node's GPUs are all joined to one another by NVLink (an NVSwitch or
    a full mesh), which makes the node one NVLink domain; false for GPUs on PCIe alone (or only
    bridged in pairs): such a node takes no tensor-parallel group of more than one GPU.
    """

    type = "NodeRegistered"
    hostname: str
    gpu_type: str
    gpus: list[GpuInfo] = Field(min_length=1)
    rack: str
    block: str
    nvlink_domain: str | None = None
    # Left out by producers before it existed: their nodes were taken as NVLink domains.
    nvlink: bool = True
    labels: dict[str, str] = Field(default_factory=dict)
    discovered_by: Literal["nvml", "spec"]
    # Node resources (None: not declared, and then not limited).
    cpus: int | None = Field(default=None, ge=1)
    memory_mb: int | None = Field(default=None, ge=1)
    # The GPU model with its MIG profile table (`H100-80GB`); gpu_type is the short name.
    gpu_model: str | None = Field(default=None, min_length=1, max_length=64)
    mig: MigMode = "none"
    # `fixed`: the profiles every GPU of the node holds, in the order written.
    mig_profiles: list[str] = Field(default_factory=list, max_length=7)
    # How long a change of one GPU's MIG geometry takes, during which it serves nothing.
    reconfigure_s: float = Field(default=DEFAULT_RECONFIGURE_S, ge=0)


class NodeLost(NodeEvent):
    type = "NodeLost"
    reason: str
    last_heartbeat_at: datetime | None = None


class NodeRecovered(NodeEvent):
    type = "NodeRecovered"


class NodeDegraded(NodeEvent):
    type = "NodeDegraded"
    signal: HealthSignal
    detail: str
    gpu_index: int | None = None


class NodeDrainRequested(NodeEvent):
    """No new gang lands on the node; running gangs finish or are checkpointed away."""

    type = "NodeDrainRequested"
    reason: str
    by: str
    # An operator's drain may let running gangs go on until then; they are checkpointed and
    # moved after it (none: at once).
    deadline: datetime | None = None


class NodeDrained(NodeEvent):
    """The node is drained and holds no gang."""

    type = "NodeDrained"


class NodeUndrained(NodeEvent):
    type = "NodeUndrained"
    by: str


class GpuUnhealthy(NodeEvent):
    type = "GpuUnhealthy"
    gpu_index: int = Field(ge=0)
    reason: str


class GpuRecovered(NodeEvent):
    type = "GpuRecovered"
    gpu_index: int = Field(ge=0)


class StragglerDetected(NodeEvent):
    """A rank on this node steps markedly slower than its gang's median."""

    type = "StragglerDetected"
    job_id: str
    rank: int = Field(ge=0)
    step_time_s: float = Field(gt=0)
    median_step_time_s: float = Field(gt=0)


class MigInstanceSpec(Message):
    """One GPU instance of a MIG geometry: a profile at a start slot (in memory slices)."""

    profile: str = Field(min_length=1, max_length=32)
    start: int = Field(ge=0, le=7)


class GpuGeometryChanged(NodeEvent):
    """The scheduler re-partitioned one idle GPU of a `mig: dynamic` node.

    From this event on, for `reconfigure_s`, the GPU serves nothing; then it holds `geometry`
    (empty: MIG off, a whole GPU again). `reason` says what it was done for."""

    type = "GpuGeometryChanged"
    gpu_index: int = Field(ge=0)
    geometry: list[MigInstanceSpec] = Field(max_length=7)
    previous: list[MigInstanceSpec] = Field(default_factory=list, max_length=7)
    reconfigure_s: float = Field(ge=0)
    reason: str = Field(max_length=512)


NODE_EVENTS: tuple[type[Event], ...] = (
    NodeRegistered,
    NodeLost,
    NodeRecovered,
    NodeDegraded,
    NodeDrainRequested,
    NodeDrained,
    NodeUndrained,
    GpuUnhealthy,
    GpuRecovered,
    StragglerDetected,
    GpuGeometryChanged,
)
