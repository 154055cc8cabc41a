"""Admission: what a submitted job must satisfy before it may wait for GPUs.

Pure rules over a catalogue folded from the log (teams, queues, nodes). A job is rejected only
for what can never change by waiting: an unknown team, a shape no cluster placement could ever
hold, a size above its team's ceiling. Transient shortages are the scheduler's to explain.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from core.host import host_rejection
from core.queue_rules import queue_owner
from core.shape import cpus_text, needs_nvlink, ranks_per_unit, unit_gpus
from core.sharing_admission import fraction_rejection
from schemas.base import Event
from schemas.jobs import JobAdmitted, JobRejected, JobSpec
from schemas.nodes import NodeRegistered
from schemas.reasons import RejectCode
from schemas.teams import QueueConfigured, TeamCreated, TeamPolicyConfigured

# The class no team may use unless the admin grants it: never preempted, and it may preempt.
RESTRICTED_PRIORITIES: frozenset[str] = frozenset({"inference-critical"})
# The longest `min_runtime_s` (a gang shielded from preemption for that long after it starts)
# a team may ask for without the admin's grant of non-preemptible jobs: long enough to load a
# model and reach a first checkpoint; longer would be a non-preemptible job by another name,
# and a lender's guarantee would wait for its borrowers' shields to run out.
MAX_PREEMPTIBLE_MIN_RUNTIME_S = 3600.0


@dataclass(frozen=True, slots=True)
class TeamPolicy:
    """What a team may ask for (TeamPolicyConfigured); the default is what a new team gets."""

    allowed_priority_classes: frozenset[str] | None = None  # None: all but RESTRICTED_PRIORITIES
    non_preemptible_allowed: bool = False
    max_pending_jobs: int | None = None
    submissions_per_second: float | None = None
    jobs_per_second: float | None = None

    @classmethod
    def of(cls, event: TeamPolicyConfigured) -> TeamPolicy:
        classes = event.allowed_priority_classes
        allowed = None if classes is None else frozenset(classes)
        return cls(
            allowed,
            event.non_preemptible_allowed,
            event.max_pending_jobs,
            event.submissions_per_second,
            event.jobs_per_second,
        )

    def may_use(self, priority: str) -> bool:
        if self.allowed_priority_classes is None:
            return priority not in RESTRICTED_PRIORITIES
        return priority in self.allowed_priority_classes


DEFAULT_TEAM_POLICY = TeamPolicy()


def policy_violation(spec: JobSpec, policy: TeamPolicy) -> tuple[RejectCode, str] | None:
    """(code, reason) when the team's policy forbids this spec: the one rule the API checks at
    once (403) and admission again when it decides (the policy may change in between)."""
    if not policy.may_use(spec.priority):
        return (
            "priority_not_allowed",
            f"team {spec.team!r} may not use priority class {spec.priority!r}",
        )
    if spec.preemptible is False and not policy.non_preemptible_allowed:
        return (
            "non_preemptible_not_allowed",
            f"team {spec.team!r} may not submit non-preemptible jobs",
        )
    if spec.min_runtime_s > MAX_PREEMPTIBLE_MIN_RUNTIME_S and not policy.non_preemptible_allowed:
        return (
            "non_preemptible_not_allowed",
            f"team {spec.team!r} may not shield a gang from preemption for more than "
            f"{MAX_PREEMPTIBLE_MIN_RUNTIME_S:g} s (min_runtime_s {spec.min_runtime_s:g} s)",
        )
    return None


@dataclass(frozen=True, slots=True)
class QueueLimits:
    name: str
    parent: str | None
    max_gpus: int | None
    # The queue's CPU and memory ceilings (None: none; core/host_quota.py).
    max_cpus: int | None = None
    max_memory_mb: int | None = None


@dataclass(frozen=True, slots=True)
class NodeShape:
    node_id: str
    gpu_type: str
    gpus: int
    rack: str
    block: str
    # The host the node declared (None: not declared, not limited).
    cpus: int | None = None
    memory_mb: int | None = None
    # What slices and shares need to know (core/sharing_admission.py): the GPU model, its MIG
    # mode and fixed profiles, and each GPU's memory.
    gpu_model: str | None = None
    mig: str = "none"
    mig_profiles: tuple[str, ...] = ()
    gpu_memory_mb: tuple[int, ...] = ()
    # Whether NVLink joins its GPUs: only then does it take tensor-parallel groups that span
    # GPUs (core/shape.py `needs_nvlink`).
    nvlink: bool = True


@dataclass
class AdmissionCatalog:
    """The teams, queues and nodes admission judges against; every node ever registered counts,
    since a drained or lost node may come back.

    Each job is judged against the whole fleet; the fleet's answers (its GPU types, how many
    tasks of a shape it could hold) are kept until a node registers, so a decision costs the
    number of distinct node shapes, not the number of nodes.
    """

    teams: set[str] = field(default_factory=set)
    policies: dict[str, TeamPolicy] = field(default_factory=dict)
    # The policy of a team the admin has not configured; None (the simulator's traces) checks
    # no team policy at all, the admission service checks DEFAULT_TEAM_POLICY.
    default_policy: TeamPolicy | None = None
    queues: dict[str, QueueLimits] = field(default_factory=dict)
    nodes: dict[str, NodeShape] = field(default_factory=dict)
    _largest_by_type: dict[str, int] | None = field(default=None, repr=False, compare=False)
    _largest_whole_by_type: dict[str, int] | None = field(default=None, repr=False, compare=False)
    _largest_joined_by_type: dict[str, int] | None = field(default=None, repr=False, compare=False)
    _placeable: dict[tuple[str | None, int, int | None, str], int] = field(
        default_factory=dict, repr=False, compare=False
    )

    def apply(self, event: Event) -> None:
        handler = _CATALOG_FOLDS.get(type(event))
        if handler is not None:
            handler(self, event)

    def _on_team_created(self, event: TeamCreated) -> None:
        self.teams.add(event.name)
        self.queues[event.name] = QueueLimits(event.name, event.parent, event.max_gpus)

    def _on_queue_configured(self, event: QueueConfigured) -> None:
        self.queues[event.name] = QueueLimits(
            event.name, event.parent, event.max_gpus, event.max_cpus, event.max_memory_mb
        )

    def _on_node_registered(self, event: NodeRegistered) -> None:
        shape = NodeShape(
            event.node_id,
            event.gpu_type,
            len(event.gpus),
            event.rack,
            event.block,
            event.cpus,
            event.memory_mb,
            event.gpu_model,
            event.mig,
            tuple(event.mig_profiles),
            tuple(gpu.memory_mb for gpu in sorted(event.gpus, key=lambda g: g.index)),
            event.nvlink,
        )
        if self.nodes.get(event.node_id) != shape:
            self.nodes[event.node_id] = shape
            self._largest_by_type = None
            self._largest_whole_by_type = None
            self._largest_joined_by_type = None
            self._placeable.clear()

    def _on_team_policy_configured(self, event: TeamPolicyConfigured) -> None:
        self.policies[event.team] = TeamPolicy.of(event)

    def queue_chain(self, name: str) -> list[QueueLimits]:
        """The queue and its ancestors, nearest first; a cycle in the tree stops the walk."""
        chain: list[QueueLimits] = []
        seen: set[str] = set()
        current: str | None = name
        while current is not None and current in self.queues and current not in seen:
            seen.add(current)
            chain.append(self.queues[current])
            current = self.queues[current].parent
        return chain

    def gpu_types(self) -> dict[str, int]:
        """Each GPU type in the fleet with the GPU count of its largest node."""
        if self._largest_by_type is None:
            largest: dict[str, int] = {}
            for node in self.nodes.values():
                largest[node.gpu_type] = max(largest.get(node.gpu_type, 0), node.gpus)
            self._largest_by_type = largest
        return self._largest_by_type

    def whole_gpu_types(self) -> dict[str, int]:
        """Each GPU type with the GPU count of its largest node that can give whole GPUs: a
        node with a fixed MIG geometry never does (a `dynamic` one is cut back when needed)."""
        if self._largest_whole_by_type is None:
            largest: dict[str, int] = {}
            for node in self.nodes.values():
                if node.mig != "fixed":
                    largest[node.gpu_type] = max(largest.get(node.gpu_type, 0), node.gpus)
            self._largest_whole_by_type = largest
        return self._largest_whole_by_type

    def joined_gpu_types(self) -> dict[str, int]:
        """`whole_gpu_types` of the nodes whose GPUs NVLink joins, where tensor-parallel groups
        that span GPUs go."""
        if self._largest_joined_by_type is None:
            largest: dict[str, int] = {}
            for node in self.nodes.values():
                if node.mig != "fixed" and node.nvlink:
                    largest[node.gpu_type] = max(largest.get(node.gpu_type, 0), node.gpus)
            self._largest_joined_by_type = largest
        return self._largest_joined_by_type

    def placeable_tasks(self, spec: JobSpec) -> int:
        """`max_placeable_tasks` over the nodes of the job's GPU type, kept per job shape."""
        key = (
            spec.gpu_type,
            spec.gpus_per_task,
            spec.topology.tp_size,
            spec.topology.require,
        )
        placeable = self._placeable.get(key)
        if placeable is None:
            nodes = [
                node
                for node in self.nodes.values()
                if (spec.gpu_type is None or node.gpu_type == spec.gpu_type) and node.mig != "fixed"
            ]
            if spec.gpu_type is not None:
                # Placement never mixes a type's nodes with and without NVLink in one gang
                # (core/shape.py `pool_of`): the gang must fit one kind or the other.
                kinds = ([node for node in nodes if node.nvlink is kind] for kind in (True, False))
                counts = [max_placeable_tasks(spec, kind) for kind in kinds if kind]
                placeable = max(counts, default=0)
            else:
                placeable = max_placeable_tasks(spec, nodes)
            self._placeable[key] = placeable
        return placeable


# The catalogue's dispatch table: each event class it folds, and how.
_CATALOG_FOLDS: dict[type[Event], Callable[[AdmissionCatalog, Any], None]] = {
    TeamCreated: AdmissionCatalog._on_team_created,
    QueueConfigured: AdmissionCatalog._on_queue_configured,
    TeamPolicyConfigured: AdmissionCatalog._on_team_policy_configured,
    NodeRegistered: AdmissionCatalog._on_node_registered,
}


def admit(
    job_id: str,
    spec: JobSpec,
    catalog: AdmissionCatalog,
    priority_classes: Collection[str],
    always_preemptible: Collection[str] = ("best-effort",),
) -> JobAdmitted | JobRejected:
    """JobAdmitted into the resolved queue, or JobRejected with the first reason that applies."""
    queue = spec.queue or spec.team

    def reject(code: RejectCode, reason: str) -> JobRejected:
        return JobRejected(job_id=job_id, code=code, reason=reason)

    if spec.team not in catalog.teams:
        return reject("unknown_team", f"team {spec.team!r} does not exist")
    if queue not in catalog.queues:
        return reject("unknown_queue", f"queue {queue!r} does not exist")
    chain = catalog.queue_chain(queue)
    if queue_owner([limits.name for limits in chain], catalog.teams) != spec.team:
        return reject("foreign_queue", f"queue {queue!r} is not under team {spec.team!r}")
    if spec.priority not in priority_classes:
        known = ", ".join(sorted(priority_classes))
        return reject("unknown_priority", f"priority {spec.priority!r} is not one of: {known}")
    policy = catalog.policies.get(spec.team, catalog.default_policy)
    violation = None if policy is None else policy_violation(spec, policy)
    if violation is not None:
        return reject(*violation)
    if spec.priority in always_preemptible and spec.preemptible is False:
        return reject(
            "not_preemptible", f"{spec.priority} jobs run on idle capacity and are preemptible"
        )

    types = catalog.gpu_types()
    if spec.gpu_type is not None and spec.gpu_type not in types:
        known_types = ", ".join(sorted(types)) or "none"
        return reject(
            "unknown_gpu_type",
            f"no node has GPUs of type {spec.gpu_type!r} (known: {known_types})",
        )
    if not types:
        return reject("no_nodes", "no node is registered in the cluster")

    rejection = capacity_rejection(spec, catalog, chain)
    if rejection is not None:
        return reject(*rejection)
    return JobAdmitted(job_id=job_id, queue=queue, priority=spec.priority)


def capacity_rejection(
    spec: JobSpec, catalog: AdmissionCatalog, chain: Sequence[QueueLimits]
) -> tuple[RejectCode, str] | None:
    """What no wait can fix: a gang over a ceiling of its queue chain, or larger than the
    fleet (CPUs and memory included) could ever hold, a MIG profile no node offers, a share of
    more GPU memory than any GPU has; None when the job could run some day.

    Admission judges it over the log; the API judges it too, over the same catalog folded from
    the events it reads, to answer 422 at submit instead of a 201 for a job rejected a moment
    later. Needs at least one registered node (`no_nodes` is admission's own rule)."""
    host = host_rejection(spec, catalog.nodes.values())
    if host is not None:
        return host
    ceiling = host_ceiling_rejection(spec, chain)
    if ceiling is not None:
        return ceiling
    if spec.fractional:
        # Slices and shares: their MIG profile or GPU memory, counted in exact fractions.
        return fraction_rejection(spec, catalog.nodes.values(), chain)
    if spec.gpus_per_task == 0:
        # A CPU-only task (DESIGN §8): no GPU rule applies; core/host.py places it.
        return None
    needed_gpus = spec.gang_min_tasks * spec.gpus_per_task
    for limits in chain:
        if limits.max_gpus is not None and needed_gpus > limits.max_gpus:
            return (
                "over_quota_max",
                f"needs {needed_gpus} GPUs but queue {limits.name!r} may never use more than "
                f"{limits.max_gpus}",
            )

    types = catalog.whole_gpu_types()
    of_type = _none_of_type(types, spec.gpu_type)
    if of_type is not None:
        return (
            "task_too_large",
            f"no node{of_type} offers whole GPUs: every one has a fixed MIG geometry "
            "(ask a mig_profile instead)",
        )
    group_gpus = unit_gpus(spec)
    if needs_nvlink(spec):
        types = catalog.joined_gpu_types()
        of_type = _none_of_type(types, spec.gpu_type)
        if of_type is not None:
            return (
                "task_too_large",
                f"a tensor-parallel group needs {group_gpus} GPUs joined by NVLink but no "
                f"node{of_type} joins its GPUs by NVLink (they talk over PCIe)",
            )
    largest_node = types[spec.gpu_type] if spec.gpu_type is not None else max(types.values())
    if group_gpus > largest_node:
        what = "a task" if group_gpus == spec.gpus_per_task else "a tensor-parallel group"
        # Named so only where some node of the kind lacks NVLink (the group could not go there).
        pcie = needs_nvlink(spec) and catalog.joined_gpu_types() != catalog.whole_gpu_types()
        node = "node joined by NVLink" if pcie else "node"
        return (
            "task_too_large",
            f"{what} needs {group_gpus} GPUs in one NVLink domain but the largest {node} has "
            f"{largest_node}",
        )

    placeable = catalog.placeable_tasks(spec)
    if placeable < spec.gang_min_tasks:
        scope = {"none": "the cluster"}.get(spec.topology.require, f"one {spec.topology.require}")
        return (
            "gang_too_large",
            f"needs {spec.gang_min_tasks} tasks of {spec.gpus_per_task} GPUs but {scope} can "
            f"hold at most {placeable}{_split_note(spec, catalog)}",
        )
    return None


def _split_note(spec: JobSpec, catalog: AdmissionCatalog) -> str:
    """Why a gang of a GPU type with nodes both with and without NVLink counts one kind."""
    if spec.gpu_type is None:
        return ""
    kinds = {node.nvlink for node in catalog.nodes.values() if node.gpu_type == spec.gpu_type}
    if len(kinds) < 2:
        return ""
    if needs_nvlink(spec):
        return " on nodes joined by NVLink"
    return " on nodes of one kind (a gang never mixes nodes with and without NVLink)"


def _none_of_type(types: Mapping[str, int], gpu_type: str | None) -> str | None:
    """Where no node of `types` serves the job's GPU type: " of type 'X'" (or "" for any
    type), worded for a rejection; None where one does."""
    if types and (gpu_type is None or gpu_type in types):
        return None
    return "" if gpu_type is None else f" of type {gpu_type!r}"


def host_ceiling_rejection(
    spec: JobSpec, chain: Sequence[QueueLimits]
) -> tuple[RejectCode, str] | None:
    """A gang whose least size asks more CPUs or memory than a queue of its chain may ever
    hold (its `max_cpus`, `max_memory_mb`)."""
    tasks = spec.gang_min_tasks
    cpus_milli = 0 if spec.cpus_per_task is None else round(spec.cpus_per_task * 1000)
    memory_mb = spec.memory_mb_per_task or 0
    for limits in chain:
        if limits.max_cpus is not None and cpus_milli * tasks > limits.max_cpus * 1000:
            return (
                "over_quota_max",
                f"needs {cpus_text(cpus_milli * tasks)} CPUs but queue {limits.name!r} may never "
                f"use more than {limits.max_cpus}",
            )
        if limits.max_memory_mb is not None and memory_mb * tasks > limits.max_memory_mb:
            return (
                "over_quota_max",
                f"needs {memory_mb * tasks} MB of memory but queue {limits.name!r} may never use "
                f"more than {limits.max_memory_mb} MB",
            )
    return None


def max_placeable_tasks(spec: JobSpec, nodes: Collection[NodeShape]) -> int:
    """How many of the job's tasks the whole fleet could hold within its `require` locality,
    if every node were empty; tensor-parallel groups of several ranks stay inside one node."""
    ranks_per_group = ranks_per_unit(spec)
    group_gpus = unit_gpus(spec)

    nvlink = needs_nvlink(spec)

    def tasks_on(node: NodeShape) -> int:
        if nvlink and not node.nvlink:
            return 0
        return (node.gpus // group_gpus) * ranks_per_group

    require = spec.topology.require
    if require == "none":
        return sum(tasks_on(node) for node in nodes)
    by_domain: dict[str, int] = defaultdict(int)
    for node in nodes:
        domain = {"node": node.node_id, "rack": node.rack, "block": node.block}[require]
        by_domain[domain] += tasks_on(node)
    return max(by_domain.values())
