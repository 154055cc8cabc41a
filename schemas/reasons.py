"""Reason codes: the machine-readable half of every "why" (the other half is a sentence).

One typed list per event that carries a code, written once here, so that the core's outcomes,
the events and whoever matches a code (the auditor, the read models) name the same values and
mypy catches a misspelled one. On the wire the codes stay plain strings: a reader must keep
loading events recorded with a code it does not know, and a new code is not a new schema.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, get_args

from pydantic import PlainValidator, WithJsonSchema

# JobDeferred.code: why a waiting job waits this cycle.
DeferCode = Literal[
    "awaiting_preemption",  # its victims are still being evicted
    "head_of_line",  # fifo: behind the first job in line
    "behind_head",  # backfill is off: behind the first job in line
    "quota_ceiling",  # a queue on its chain would exceed its max
    "unsatisfiable",  # the cluster as it is could never hold the gang
    "cycle_budget",  # the cycle's placement budget is spent
    "no_capacity",  # not enough free GPUs in one placement
    "backfill_blocked",  # it would fit but for the head's reservation
    "reserved_head",  # the head: holds a reservation
    "preempting",  # its victims were asked to leave
    "retry_backoff",  # a failed attempt: the next may start only after its backoff
    "held",  # held by request: never placed until released
    "dependency",  # a job it depends on has not ended as its condition needs yet
    "array_limit",  # its array holds, or tries ahead of it, max_parallel elements
    "insufficient_cpus",  # free GPUs, but no node among them has the CPUs a task asks
    "insufficient_memory",  # free GPUs, but no node among them has the memory a task asks
    "inference_headroom",  # placing it would take the free GPUs kept for inference-critical
    "no_mig_slice",  # no free MIG instance of its profile, and no re-partition planned for it
    "awaiting_repartition",  # a GPU is being re-partitioned to hold its slice
    "no_gpu_share",  # no soft-shared GPU of its team has room, and no whole GPU is free
    "share_other_team",  # the GPUs with room are soft-shared by another team
    "quota_ceiling_cpus",  # a queue on its chain would exceed its max_cpus
    "quota_ceiling_memory",  # a queue on its chain would exceed its max_memory_mb
    "not_considered",  # the cycle's bound on newly queued jobs was reached ahead of it
]

# JobRequeued.code: why a gang was released and its job waits again.
RequeueCode = Literal[
    "preempted",  # evicted for another job
    "node_drained",  # moved off a draining node (checkpointed where its ranks could)
    "task_failed",  # a rank failed, a retry is left
    "launch_timeout",  # ranks did not all start within the launch timeout, a retry is left
    "launch_unheard",  # ... and no rank of any gang started since: the agents could not hear
    "node_lost",  # a node of the gang was lost
    "gpu_unhealthy",  # a GPU of the gang became unhealthy
]

# PreemptionRequested.code: on which grounds a gang is evicted.
PreemptCode = Literal[
    "priority",  # for a job of a higher priority class
    "reclaim",  # its queue borrows what the preemptor's guarantee reclaims
    "overdue_reservation",  # no longer emitted (an estimate is never a limit); kept for old logs
    "fairness",  # it has received much more service than a waiting job of its queue
]

# JobRejected.code: why admission refused a job for good.
RejectCode = Literal[
    "unknown_team",
    "unknown_queue",
    "foreign_queue",
    "unknown_priority",
    "not_preemptible",
    "unknown_gpu_type",
    "no_nodes",
    "over_quota_max",
    "task_too_large",
    "gang_too_large",
    "priority_not_allowed",  # the team's policy does not grant this priority class
    "non_preemptible_not_allowed",  # the team's policy does not allow non-preemptible jobs
    "mig_profile_unavailable",  # no node offers the job's MIG profile
    "gpu_share_unavailable",  # every GPU of the job's type has a fixed MIG geometry
    "gpu_memory_too_large",  # a share asks more GPU memory than any GPU has
    # No longer decided (CPU-only tasks are scheduled): kept for events recorded before.
    "cpu_only_unsupported",
]

DEFER_CODES: frozenset[str] = frozenset(get_args(DeferCode))
REQUEUE_CODES: frozenset[str] = frozenset(get_args(RequeueCode))
REJECT_CODES: frozenset[str] = frozenset(get_args(RejectCode))
PREEMPT_CODES: frozenset[str] = frozenset(get_args(PreemptCode))


def _any_code(value: Any) -> str:
    # Old events keep loading with codes this code no longer knows, new ones with codes an
    # older reader never knew: the value is checked to be a string, not one of the list.
    if not isinstance(value, str):
        raise ValueError("a reason code is a string")
    return value


# The event fields: typed for the code that writes them (mypy checks the value), a plain
# string on the wire and in the exported JSON Schema (unchanged, so not a breaking change).
DeferCodeField = Annotated[DeferCode, PlainValidator(_any_code), WithJsonSchema({"type": "string"})]
RequeueCodeField = Annotated[
    RequeueCode, PlainValidator(_any_code), WithJsonSchema({"type": "string"})
]
PreemptCodeField = Annotated[
    PreemptCode, PlainValidator(_any_code), WithJsonSchema({"type": "string"})
]
RejectCodeField = Annotated[
    RejectCode, PlainValidator(_any_code), WithJsonSchema({"type": "string"})
]

# The codes other modules match on, by name.
RESERVED_HEAD: DeferCode = "reserved_head"
QUOTA_CEILING: DeferCode = "quota_ceiling"
TASK_FAILED: RequeueCode = "task_failed"
LAUNCH_TIMEOUT: RequeueCode = "launch_timeout"
LAUNCH_UNHEARD: RequeueCode = "launch_unheard"
NODE_LOST: RequeueCode = "node_lost"
RETRY_BACKOFF: DeferCode = "retry_backoff"
NOT_CONSIDERED: DeferCode = "not_considered"
HELD: DeferCode = "held"
DEPENDENCY: DeferCode = "dependency"
ARRAY_LIMIT: DeferCode = "array_limit"
# Waits the job's own team chose (a hold, its dependencies, its array's limit): not the
# scheduler's doing, so no promise about waiting (a guarantee's reclaim) runs meanwhile.
USER_WAIT_CODES: frozenset[DeferCode] = frozenset({HELD, DEPENDENCY, ARRAY_LIMIT})
# Requeue codes that count as a failure of the job (retries, backoff): not hardware's fault.
FAILURE_REQUEUE_CODES: frozenset[RequeueCode] = frozenset({TASK_FAILED, LAUNCH_TIMEOUT})
# Requeue codes of a gang lost under its job (its node, a GPU, its agent): nobody's decision.
LOST_GANG_REQUEUE_CODES: frozenset[RequeueCode] = frozenset({NODE_LOST, "gpu_unhealthy"})
# How the TaskExited reason of a rank an agent found at its restart begins ("… lost", "…
# stopped"): its predecessor died (a crash, a kill, an OOM of the agent), and the rank with it
# or by its successor's hand. Not the job's doing: no retry is spent on it (as for a lost node).
AGENT_RESTARTED = "agent restarted: rank "
