"""The knobs of the scheduler: priority classes and the scheduling policy, as plain frozen data."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Literal

PolicyName = Literal["gangway", "fifo"]
# A caller's order of waiting jobs: a sortable key of a job's id, smaller first.
JobOrderKey = Callable[[str], tuple[float, ...]]


@dataclass(frozen=True, slots=True)
class PriorityClass:
    """A named priority level.

    `rank` orders classes: a larger rank outranks a smaller one. `preemptible` says whether a
    gang of this class may be evicted; `can_preempt` whether its jobs may evict lower ranks.
    """

    name: str
    rank: int
    preemptible: bool
    can_preempt: bool


DEFAULT_PRIORITY_CLASSES: tuple[PriorityClass, ...] = (
    PriorityClass("inference-critical", rank=300, preemptible=False, can_preempt=True),
    PriorityClass("production", rank=200, preemptible=True, can_preempt=True),
    PriorityClass("research", rank=100, preemptible=True, can_preempt=False),
    PriorityClass("best-effort", rank=0, preemptible=True, can_preempt=False),
)


# Newly queued jobs one cycle considers, by default: a busy 100,000-GPU cycle considering 2,000
# of a 9,400-job burst costs about what one without a burst does (docs/benchmarks.md).
DEFAULT_MAX_NEW_JOBS_PER_CYCLE = 2_000


@dataclass(frozen=True, slots=True)
class SchedulingPolicy:
    """How the core decides; every field has a default an operator would expect.

    `name="fifo"` is the baseline: strict arrival order, head-of-line blocking, no backfill,
    no preemption, quotas ignored.
    """

    name: PolicyName = "gangway"
    priority_classes: tuple[PriorityClass, ...] = DEFAULT_PRIORITY_CLASSES
    default_priority: str = "research"
    backfill: bool = True
    preemption: bool = True
    preemption_grace_s: float = 120.0
    fair_share_half_life_s: float = 7 * 86400.0
    # No job waits longer than this before it becomes the head of the line with a reservation.
    aging_max_wait_s: float = 6 * 3600.0
    # A gang preempted (or a preemptor that preempted) is left alone for this long, against storms.
    hysteresis_s: float = 600.0
    # Used for backfill planning when a job gives no estimated_runtime_s.
    default_runtime_estimate_s: float = 4 * 3600.0
    # Runtimes learned from finished jobs stand in for (or correct) users' estimates
    # (core/estimates.py); off, only what the spec states counts.
    learned_runtimes: bool = True
    # A job past its estimate is planned to end this long after `now` (it may end any moment).
    overrun_grace_s: float = 300.0
    # A reservation is re-announced only when its start moves by more than this, or its nodes.
    reservation_move_threshold_s: float = 300.0
    # Best-effort jobs run only on idle capacity: they never count against a guarantee.
    idle_only_priority: str = "best-effort"
    enforce_quotas: bool = True
    # A reserved gang whose ranks have not all started by then is released (a failure).
    launch_timeout_s: float = 300.0
    # A gang whose rank failed waits before its next attempt: base·2^(failures-1), capped,
    # with jitter (core/retry.py). A base of 0 turns the backoff off.
    retry_backoff_base_s: float = 10.0
    retry_backoff_cap_s: float = 600.0
    # Placements a cycle may make; the rest wait for the next cycle (bounds cycle time).
    max_placements_per_cycle: int = 20_000
    # Newly queued jobs (admitted or resumed, not yet considered by any cycle) a cycle
    # considers, in the order's order (as Slurm's default_queue_depth, counted in newcomers):
    # the cycle stops at the first one past the bound, and it and every job behind it wait for
    # the next cycle, which follows at once (core/ordering.py `within_depth`). A flood of N
    # arrivals is considered within ceil(N / bound) cycles, a high class first; fewer
    # arrivals than the bound (every cycle but a flood's) see no difference.
    max_new_jobs_per_cycle: int = DEFAULT_MAX_NEW_JOBS_PER_CYCLE
    # SLO class (core/slo.py): the class admitted at once even on a full cluster; free GPUs
    # no other class may take (0: none kept); the largest gang (in GPUs) evicted for it.
    inference_class: str = "inference-critical"
    inference_headroom_gpus: int = 0
    inference_max_victim_gpus: int = 8
    # Slices and shares (core/fractional.py): `fgd` places each task where the fragmentation
    # of the held mix grows least, among the `sharing_shortlist` best-fit spots; `best-fit`
    # takes the first of them (the FGD paper's baseline).
    sharing_packing: Literal["fgd", "best-fit"] = "fgd"
    sharing_shortlist: int = 16
    # Attained service (core/attained.py, Tiresias' 2D-LAS): a job's GPU-seconds received so
    # far, all attempts together, put it on a level; level k holds service below the k-th
    # threshold. Within a queue and class, a lower level goes first (then age).
    las_thresholds_gpu_s: tuple[float, ...] = (3600.0, 36_000.0, 360_000.0)
    # Predicted-short first (core/ordering.py): within a queue, class and attained-service
    # level, a job within its queue's guarantee whose predicted runtime
    # (core/reservation.py:runtime_estimate: the user's estimate as the team's record corrects
    # it, else what jobs like it ran) falls below a lower threshold goes first; levels, not raw
    # seconds, keep jobs of similar length in arrival order. Empty: arrival order only. One
    # level, under 15 minutes: on Philly (docs/simulator.md) it shortened waits and harmed
    # nothing, where three (15 min, 1 h, 4 h) lengthened the p99 queue and the average JCT.
    predicted_length_thresholds_s: tuple[float, ...] = (900.0,)
    # Preemption for fairness (core/fairness.py): a waiting job may have a running gang of its
    # own queue and class evicted (checkpoint-then-evict) when that gang sits at least
    # `fairness_level_gap` levels higher, has run `fairness_min_runtime_s` in this attempt,
    # and the gain (the waiter's GPUs x the victim's run so far, the LAS guess of what is
    # left of it) is `fairness_gain_factor` times the cost (the victim's GPUs x the
    # checkpoint write plus the work lost since its last checkpoint).
    fairness_preemption: bool = True
    fairness_level_gap: int = 1
    fairness_min_runtime_s: float = 600.0
    fairness_gain_factor: float = 2.0
    # Until the log says how long a job's checkpoints take: what one is assumed to take.
    checkpoint_write_estimate_s: float = 60.0
    # Gangs over this many GPUs are never evicted for fairness by a smaller job: the small
    # jobs' gain must not be paid by the large gangs.
    fairness_protected_gang_gpus: int = 8
    # A caller-given order of the waiting jobs in place of class, fair share and aging, keyed
    # by job id (ties by arrival). The simulator's baselines (fifo with quotas, clairvoyant
    # oracles) use it to run through the same quotas and placement; knowledge the key holds
    # (a trace's true runtimes) stays with the caller. Gangway's own policy leaves it None.
    order_key: JobOrderKey | None = field(default=None, compare=False)
    _classes: dict[str, PriorityClass] = field(
        init=False, repr=False, compare=False, hash=False, default_factory=dict
    )

    def __post_init__(self) -> None:
        if self.name not in ("gangway", "fifo"):
            raise ValueError(f"unknown policy {self.name!r}")
        if not self.priority_classes:
            raise ValueError("at least one priority class is needed")
        classes = {pc.name: pc for pc in self.priority_classes}
        if len(classes) != len(self.priority_classes):
            raise ValueError("priority class names must be unique")
        self._classes.update(classes)
        thresholds = self.las_thresholds_gpu_s
        if any(b <= a for a, b in pairwise(thresholds)) or any(t <= 0 for t in thresholds):
            raise ValueError("las_thresholds_gpu_s must be positive and increasing")
        if self.max_new_jobs_per_cycle < 1:
            raise ValueError("max_new_jobs_per_cycle must be at least 1")
        lengths = self.predicted_length_thresholds_s
        if any(b <= a for a, b in pairwise(lengths)) or any(t <= 0 for t in lengths):
            raise ValueError("predicted_length_thresholds_s must be positive and increasing")

    @property
    def is_fifo(self) -> bool:
        return self.name == "fifo"

    def priority_class(self, name: str) -> PriorityClass:
        """The class of that name; an unknown name falls back to the default class (or lowest)."""
        found = self._classes.get(name)
        if found is not None:
            return found
        fallback = self._classes.get(self.default_priority)
        if fallback is not None:
            return fallback
        return min(self.priority_classes, key=lambda pc: pc.rank)
