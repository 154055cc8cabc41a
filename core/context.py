"""What one cycle's phases share: the state they read, the clock, and the cycle's ledger.

Each phase (reactions, order, place and backfill, preempt, explain) is a function of one
`CycleContext`; what it decides goes into the context's ledger (decisions in order, the gangs
released, the jobs handled, why each waiting job waits, when to wake up next).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from core.policy import SchedulingPolicy
from core.shape import Shape
from core.state import CoreJob, HeldGang
from core.surface import PlanningSurface
from schemas.base import Event
from schemas.reasons import DeferCode

if TYPE_CHECKING:
    from core.fractional import SharingTrial
    from core.preemption import VictimPool


@dataclass(slots=True)
class CycleResult:
    """The decisions of one cycle, plus figures for metrics and benchmarks."""

    decisions: list[Event] = field(default_factory=list)
    gangs_placed: int = 0
    tasks_placed: int = 0
    preemptions: int = 0
    considered: int = 0
    # Waiting jobs this cycle left for the next, past its bound on newly queued ones
    # (core/ordering.py `within_depth`): a caller runs the next cycle at once.
    not_considered: int = 0
    skipped: bool = False
    # The earliest time at which a cycle without new events could decide something new.
    next_wakeup: float | None = None
    head_job_id: str | None = None


@dataclass(slots=True)
class Outcome:
    """Why a waiting job stays waiting this cycle (typed, as Kubernetes' framework statuses)."""

    code: DeferCode
    message: str


@dataclass(slots=True)
class HeadReservation:
    """The head's reservation planned this cycle (core/backfill.py `reserve`)."""

    head: CoreJob
    start: float
    # The reserved nodes' ids, sorted, and the racks they are on, as a reason words them.
    node_ids: list[str]
    where: str
    # The jobs blocked ahead of the head (placed before it was found): the backfill rule
    # keeps none of them off its nodes.
    ahead: frozenset[str] = frozenset()
    # Whether this cycle recorded it (ReservationPlanned): the core records a reservation
    # only when it moves, and the auditor judges a decision that rested on one by what the
    # log recorded of it in the same cycle (core/reservation.py `record_reservation`).
    recorded: bool = False
    # Whether the head itself asked for evictions this cycle (core/preemption.py `preempt`): it
    # lands on its victims' GPUs, not as planned, so its reservation keeps no reclaimer off
    # the reserved nodes' idle GPUs (`KeptOff`).
    evicting: bool = False


@dataclass(slots=True)
class CycleContext:
    state: PlanningSurface
    policy: SchedulingPolicy
    now: float
    result: CycleResult = field(default_factory=CycleResult)
    # Gangs this cycle released (their GPUs are free to plan with) and jobs it already decided.
    released: set[str] = field(default_factory=set)
    handled: set[str] = field(default_factory=set)
    outcomes: dict[str, Outcome] = field(default_factory=dict)
    wakeups: list[float] = field(default_factory=list)
    # Why a shape could never fit the cluster as it is (None: it could), asked once per shape.
    infeasibility: dict[Shape, str | None] = field(default_factory=dict)
    # Gangs bound in this cycle, (estimated end, ranks, each rank's host ask as (thousandths
    # of a CPU, MB)), for the head's reservation.
    placed_gangs: list[tuple[float, list[tuple[int, int]], tuple[int, int]]] = field(
        default_factory=list
    )
    # The gangs already leaving were credited to their queues' quota (preemption.credit_leaving):
    # once per cycle, whichever preemption phase comes first.
    leaving_credited: bool = False
    # Preemptors whose victims are leaving, their GPUs charged to their queues
    # (preemption.book_arriving, request_evictions): each once per cycle.
    arriving: set[str] = field(default_factory=set)
    # The cycle's tentative slices and shares (core/fractional.py), while it places.
    sharing: SharingTrial | None = None
    # The gangs that may be preempted this cycle (core/preemption.py `victim_pool`), built once
    # when the place phase or the preemption phase first asks: both read the state as the
    # cycle began.
    victim_pool: VictimPool | None = None
    # The holding gangs' estimated ends and what the head's plan reads of each, as the
    # planner's timers keep them (core/timers.py `GangTimers.held_ends`), brought up to date by
    # this cycle's reactions phase; None: a planner without timers (the plan walks the gangs).
    held_ends: tuple[dict[str, float], dict[str, HeldGang]] | None = None
    # The head's reservation, once the place phase planned one.
    reservation: HeadReservation | None = None

    @classmethod
    def start(cls, state: PlanningSurface, now: float) -> CycleContext:
        return cls(state=state, policy=state.policy, now=now)

    def emit(self, event: Event) -> None:
        self.result.decisions.append(event)

    def release(self, job: CoreJob, event: Event) -> None:
        """Record a decision that releases the job's gang (its GPUs may be planned with)."""
        self.emit(event)
        self.released.add(job.job_id)
        self.handled.add(job.job_id)

    def calming(self, job: CoreJob) -> bool:
        """Whether the job asked for evictions within the hysteresis (it plans none until
        then, so nothing thrashes); its calm's end is then a wake-up. One rule for every
        preemption planner: whole GPUs, slices and shares, and whole GPUs back from them."""
        if job.last_preempting_at is None:
            return False
        calm_until = job.last_preempting_at + self.policy.hysteresis_s
        if self.now < calm_until:
            self.wakeups.append(calm_until)
            return True
        return False

    def victims_pending(self, job: CoreJob) -> list[str]:
        """The job's victims still being evicted: their GPUs are about to come free.

        Only a gang still under eviction counts. A victim that was requeued and then bound a
        new gang (a backfill, even onto the very GPUs it gave up) releases nothing for this
        job: counting it kept the preemptor waiting "for its victims", and out of the
        preemption phase, until that new gang ended on its own (invariant 4).
        """
        jobs = self.state.job_records
        return [
            victim
            for victim in job.awaiting_victims
            if victim not in self.released
            and (record := jobs.get(victim)) is not None
            and record.state == "preempting"
        ]

    def victims_released(self, job: CoreJob) -> bool:
        if not job.awaiting_victims:
            return False
        return not self.victims_pending(job)
