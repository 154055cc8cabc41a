"""The auditor checks the scheduling promises of DESIGN §3 a log can show: each rule is fed a
history that breaks it (built by hand) and one the real scheduler wrote that keeps it."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

from hypothesis import given, settings
from hypothesis import strategies as st

from core import Auditor, Violation, parse_cluster_spec
from core.audit import RULES
from schemas.base import Event
from schemas.jobs import (
    GangReserved,
    JobAdmitted,
    JobChanges,
    JobDeferred,
    JobRequeued,
    JobSpec,
    JobSubmitted,
    JobSucceeded,
    JobUpdated,
    PreemptionRequested,
    RankPlacement,
    ReservationPlanned,
    TaskStarted,
)
from schemas.nodes import NodeDrained, NodeDrainRequested
from schemas.teams import QueueConfigured, TeamCreated
from tests.core.builders import T0, History, a_job, share_on

T = 1_700_000_000.0
WHOLE = list(range(8))


def audit(events: Sequence[Event], one_cycle_from: int | None = None) -> list[Violation]:
    """Each event a second after the last; from `one_cycle_from` on, all in one cycle."""
    auditor = Auditor()
    for position, event in enumerate(events):
        at = T + position
        if one_cycle_from is not None and position >= one_cycle_from:
            at = T + one_cycle_from
        auditor.observe(event, position, at, None)
    return auditor.violations


def rules(violations: Sequence[Violation]) -> set[str]:
    return {v.rule for v in violations}


def team(name: str, guaranteed: int = 0) -> TeamCreated:
    return TeamCreated(name=name, guaranteed_gpus=guaranteed, token_sha256="0" * 64)


def job(job_id: str, team: str = "t", priority: str = "research", **spec: object) -> list[Event]:
    fields: dict[str, object] = {"name": job_id, "team": team, "gpus_per_task": 8, **spec}
    return [
        JobSubmitted(job_id=job_id, spec=JobSpec.model_validate(fields), submitted_by="u"),
        JobAdmitted(job_id=job_id, queue=team, priority=priority),
    ]


def gang(job_id: str, *ranks: tuple[str, list[int]], attempt: int = 1) -> GangReserved:
    return GangReserved(
        job_id=job_id,
        attempt=attempt,
        ranks=[RankPlacement(rank=i, node_id=n, gpus=g) for i, (n, g) in enumerate(ranks)],
    )


def running(job_id: str, *ranks: tuple[str, list[int]]) -> list[Event]:
    started = [
        TaskStarted(job_id=job_id, attempt=1, rank=i, node_id=node)
        for i, (node, _) in enumerate(ranks)
    ]
    return [gang(job_id, *ranks), *started]


def preempt(victim: str, preemptor: str | None) -> PreemptionRequested:
    return PreemptionRequested(
        job_id=victim, attempt=1, preemptor_job_id=preemptor, reason="r", grace_s=120
    )


def test_every_rule_is_named_for_reports() -> None:
    assert set(RULES) == {
        "topology",
        "cross_queue",
        "idle_capacity",
        "borrowers_first",
        "drain",
        "backfill",
        "host_ceiling",
    }
    violation = Violation(0, "m", (1,), "drain")
    assert violation.kind == "rule drain"
    assert Violation(3, "m", (1,)).kind == "invariant 3"


# ---------------------------------------------------------------- topology


def test_a_gang_that_requires_one_rack_but_spans_two_breaks_the_topology_rule() -> None:
    cluster = list(parse_cluster_spec("4x8:2:2"))  # racks r000 (n0, n1) and r001 (n2, n3)
    spanning = [
        *cluster,
        *job("a", tasks=2, topology={"require": "rack"}),
        gang("a", ("n0001", WHOLE), ("n0002", WHOLE)),
    ]
    inside = [
        *cluster,
        *job("a", tasks=2, topology={"require": "rack"}),
        gang("a", ("n0002", WHOLE), ("n0003", WHOLE)),
    ]

    violations = audit(spanning)
    assert rules(violations) == {"topology"}
    assert "requires one rack" in violations[0].message
    assert audit(inside) == []


def test_a_gang_that_requires_one_node_or_block_and_spans_more_breaks_the_rule() -> None:
    cluster = list(parse_cluster_spec("4x8:1:2"))  # one node per rack, two racks per block
    node = [
        *cluster,
        *job("a", gpus_per_task=2, tasks=2, topology={"require": "node"}),
        gang("a", ("n0000", [0, 1]), ("n0001", [0, 1])),
    ]
    block = [
        *cluster,
        *job("b", tasks=2, topology={"require": "block"}),
        gang("b", ("n0001", WHOLE), ("n0002", WHOLE)),
    ]
    block_ok = [
        *cluster,
        *job("b", tasks=2, topology={"require": "block"}),
        gang("b", ("n0000", WHOLE), ("n0001", WHOLE)),
    ]

    assert rules(audit(node)) == {"topology"}
    assert rules(audit(block)) == {"topology"}
    assert audit(block_ok) == []


def test_a_gang_on_gpus_of_another_type_breaks_the_topology_rule() -> None:
    spec = "groups:\n- {count: 1, gpus: 8, gpu_type: A100}\n- {count: 1, gpus: 8, gpu_type: H100}\n"
    cluster = list(parse_cluster_spec(spec))
    wrong = [*cluster, *job("a", gpu_type="H100"), gang("a", ("n0000", WHOLE))]
    right = [*cluster, *job("a", gpu_type="H100"), gang("a", ("n0001", WHOLE))]

    assert rules(audit(wrong)) == {"topology"}
    assert audit(right) == []


def test_the_scheduler_keeps_required_localities() -> None:
    history = History("8x8:2:2")
    history.submit(a_job().gpus(8).tasks(3))
    history.submit(
        a_job().gpus(8).tasks(2).require("rack"),
        a_job().gpus(2).tasks(3).require("node"),
        a_job().gpus(8).tasks(3).require("block"),
    )
    history.run(cycles=2)

    assert history.auditor.violations == []


# ---------------------------------------------------------------- drain


def test_a_node_reported_drained_while_a_gang_holds_it_breaks_the_drain_rule() -> None:
    early = [
        *parse_cluster_spec("2x8:2:1"),
        *job("a"),
        gang("a", ("n0000", WHOLE)),
        NodeDrainRequested(node_id="n0000", reason="ecc", by="health"),
        NodeDrained(node_id="n0000"),
    ]
    emptied = [
        *early[:-1],
        JobRequeued(job_id="a", attempt=1, code="node_drained", reason="r"),
        NodeDrained(node_id="n0000"),
    ]

    violations = audit(early)
    assert rules(violations) == {"drain"}
    assert "job a still holds" in violations[0].message
    assert audit(emptied) == []


# ---------------------------------------------------------------- preemption


def test_preempting_a_gang_within_its_queues_guarantee_for_another_team_is_flagged() -> None:
    events = [
        *parse_cluster_spec("2x8:2:1"),
        team("owner", guaranteed=8),
        team("other", guaranteed=8),
        *job("held", team="owner"),
        *running("held", ("n0000", WHOLE)),
        *job("mine", team="other"),
        *running("mine", ("n0001", WHOLE)),
        *job("urgent", team="other", priority="production"),
        preempt("held", "urgent"),
    ]

    violations = audit(events)

    assert rules(violations) == {"cross_queue"}
    assert "within its guarantee of 8 GPUs" in violations[0].message


def test_preempting_a_borrower_of_another_team_keeps_the_rules() -> None:
    events = [
        *parse_cluster_spec("2x8:2:1"),
        team("owner", guaranteed=8),
        team("lender"),
        *job("b1", team="lender"),
        *running("b1", ("n0000", WHOLE)),
        *job("b2", team="lender"),
        *running("b2", ("n0001", WHOLE)),
        *job("o", team="owner"),
        preempt("b2", "o"),
    ]

    assert audit(events) == []


def test_the_second_plan_of_a_cycle_sees_the_first_plans_victims_credited() -> None:
    """Two preemptors in one cycle: the lender's usage drops by the first victim, so taking its
    last gang (now within its guarantee) for the second preemptor is flagged."""
    events: list[Event] = [
        *parse_cluster_spec("3x8:3:1"),
        team("lender", guaranteed=8),
        team("owner", guaranteed=16),
        *job("b1", team="lender"),
        *running("b1", ("n0000", WHOLE)),
        *job("b2", team="lender"),
        *running("b2", ("n0001", WHOLE)),
        *job("x", team="owner"),
        *running("x", ("n0002", WHOLE)),
        *job("o1", team="owner"),
        *job("o2", team="owner"),
    ]
    auditor = Auditor()
    for position, event in enumerate(events):
        auditor.observe(event, position, T, None)
    cycle = T + 1000
    auditor.observe(preempt("b1", "o1"), 100, cycle, None)
    assert auditor.violations == []
    auditor.observe(preempt("b2", "o2"), 101, cycle, None)

    assert rules(auditor.violations) == {"cross_queue"}


def test_preempting_while_idle_gpus_could_serve_is_flagged() -> None:
    events = [
        *parse_cluster_spec("2x8:2:1"),
        *job("low", priority="best-effort"),
        *running("low", ("n0000", WHOLE)),
        *job("urgent", priority="production"),
        preempt("low", "urgent"),
    ]
    full = [
        *events[:-1],
        *job("other", priority="production"),
        *running("other", ("n0001", WHOLE)),
        preempt("low", "urgent"),
    ]

    violations = audit(events)
    assert rules(violations) == {"idle_capacity"}
    assert "idle GPUs could host job urgent" in violations[0].message
    assert audit(full) == []


def test_idle_gpus_scattered_in_pieces_too_small_for_a_unit_do_not_count() -> None:
    events = [
        *parse_cluster_spec("2x8:2:1"),
        *job("low", priority="best-effort"),
        *running("low", ("n0000", WHOLE)),
        *job("half", gpus_per_task=4, priority="production"),
        *running("half", ("n0001", [0, 1, 2, 3])),
        *job("urgent", priority="production"),  # 8 GPUs in one node; n0001 has 4 free
        preempt("low", "urgent"),
    ]

    assert audit(events) == []


def test_evicting_ones_own_gang_while_a_borrower_would_serve_is_flagged() -> None:
    lender_first = [
        *parse_cluster_spec("2x8:2:1"),
        team("ops"),
        team("lender"),
        *job("mine", team="ops", priority="best-effort"),
        *running("mine", ("n0000", WHOLE)),
        *job("borrowed", team="lender", priority="research"),
        *running("borrowed", ("n0001", WHOLE)),
        *job("urgent", team="ops", priority="production"),
        preempt("mine", "urgent"),
    ]
    borrower_first = [*lender_first[:-1], preempt("borrowed", "urgent")]

    violations = audit(lender_first)
    assert rules(violations) == {"borrowers_first"}
    assert "borrowed" in violations[0].message
    assert audit(borrower_first) == []


def test_a_protected_borrower_does_not_count_against_evicting_ones_own_gang() -> None:
    events = [
        *parse_cluster_spec("2x8:2:1"),
        team("ops"),
        team("lender"),
        *job("mine", team="ops", priority="best-effort"),
        *running("mine", ("n0000", WHOLE)),
        *job("young", team="lender", priority="research", min_runtime_s=3600),
        *running("young", ("n0001", WHOLE)),
        *job("urgent", team="ops", priority="production"),
        preempt("mine", "urgent"),
    ]

    assert audit(events) == []


def test_the_scheduler_reclaims_from_borrowers_and_keeps_the_preemption_rules() -> None:
    history = History("4x8:4:1")
    history.team("alpha", guaranteed=16).team("beta", guaranteed=16)
    history.submit(*(a_job().gpus(8).team("beta") for _ in range(4)))
    history.run()
    history.submit(a_job().gpus(8).team("alpha"), a_job().gpus(8).team("alpha"))

    history.run(cycles=3)

    assert len(history.events(PreemptionRequested)) == 2
    assert history.auditor.violations == []


# ---------------------------------------------------------------- backfill


def _reserved_head(*waiting: Event) -> list[Event]:
    """A head reserved behind a blocker, the `waiting` jobs submitted before the cycle that
    records its reservation (last)."""
    return [
        *parse_cluster_spec("2x8:2:1"),
        *job("blocker"),
        *running("blocker", ("n0000", WHOLE)),
        *job("head", tasks=2),
        *waiting,
        ReservationPlanned(
            job_id="head",
            start_at=datetime.fromtimestamp(T + 3600, UTC),
            nodes=["n0000", "n0001"],
        ),
    ]


def test_a_later_job_on_a_reserved_node_past_the_reservations_start_breaks_backfill() -> None:
    head = _reserved_head(*job("long", estimated_runtime_s=7200))
    events = [*head, gang("long", ("n0001", WHOLE))]

    violations = audit(events, one_cycle_from=len(head) - 1)

    assert rules(violations) == {"backfill"}
    assert "reserved for job head" in violations[0].message


def test_a_reservation_recorded_in_an_earlier_cycle_of_the_same_instant_is_not_held() -> None:
    """Several cycles may share one instant: after the recording cycle's reasons (or any
    event between cycles) the recorded nodes may no longer be the reserved ones."""
    head = _reserved_head(*job("long", estimated_runtime_s=7200))
    deferred = JobDeferred(job_id="head", code="reserved_head", message="m")
    later = [*head, deferred, gang("long", ("n0001", WHOLE))]
    submitted = [*head, *job("other"), gang("long", ("n0001", WHOLE))]

    assert audit(later, one_cycle_from=len(head) - 1) == []
    assert audit(submitted, one_cycle_from=len(head) - 1) == []


def test_a_reservation_recorded_in_an_earlier_cycle_is_not_held_against_later_placements() -> None:
    """The core re-plans the head each cycle and records it only when it moves: the nodes of
    an earlier record may no longer be the reserved ones."""
    events = [*_reserved_head(*job("long", estimated_runtime_s=7200))]
    events.append(gang("long", ("n0001", WHOLE)))

    assert audit(events) == []


def test_a_later_job_that_ends_before_the_reservation_may_backfill() -> None:
    events = [
        *_reserved_head(*job("short", estimated_runtime_s=600)),
        gang("short", ("n0001", WHOLE)),
    ]

    assert audit(events, one_cycle_from=len(events) - 2) == []


def test_a_higher_class_job_may_take_reserved_nodes() -> None:
    events = [
        *_reserved_head(*job("urgent", priority="production", estimated_runtime_s=7200)),
        gang("urgent", ("n0001", WHOLE)),
    ]

    assert audit(events, one_cycle_from=len(events) - 2) == []


def test_a_later_job_whose_estimate_was_shortened_may_backfill() -> None:
    # attack5's storm: a job's estimate patched from none to 5 s, then backfilled onto the
    # head's nodes as the scheduler judged it on the patched spec; the auditor read the
    # submitted spec (the default 4 h estimate) and called it a broken backfill.
    shortened = JobUpdated(job_id="short", by="u", changes=JobChanges(estimated_runtime_s=600))
    events = [
        *_reserved_head(*job("short", estimated_runtime_s=7200), shortened),
        gang("short", ("n0001", WHOLE)),
    ]

    assert audit(events, one_cycle_from=len(events) - 2) == []


def test_a_later_job_whose_estimate_was_lengthened_breaks_backfill() -> None:
    lengthened = JobUpdated(job_id="long", by="u", changes=JobChanges(estimated_runtime_s=7200))
    events = [
        *_reserved_head(*job("long", estimated_runtime_s=600), lengthened),
        gang("long", ("n0001", WHOLE)),
    ]

    assert rules(audit(events, one_cycle_from=len(events) - 2)) == {"backfill"}


def test_a_job_raised_to_a_higher_class_may_take_reserved_nodes() -> None:
    raised = JobUpdated(job_id="urgent", by="u", changes=JobChanges(priority="production"))
    submitted, admitted = job("urgent", estimated_runtime_s=7200)
    after = [*_reserved_head(submitted, admitted, raised), gang("urgent", ("n0001", WHOLE))]
    # Raised before admission decided: admission's class (the submitted one) does not undo it.
    before = [*_reserved_head(submitted, raised, admitted), gang("urgent", ("n0001", WHOLE))]

    assert audit(after, one_cycle_from=len(after) - 2) == []
    assert audit(before, one_cycle_from=len(before) - 2) == []


def test_the_scheduler_backfills_without_delaying_the_head() -> None:
    history = History("2x8:2:1")
    history.submit(a_job().gpus(4).estimate(3600))
    history.run()
    history.submit(a_job().gpus(8).tasks(2).estimate(600))
    history.run()
    history.submit(a_job().gpus(4).estimate(600), a_job().gpus(4).estimate(10 * 3600))

    history.run(cycles=3)

    assert history.auditor.violations == []


def test_a_backfill_is_judged_at_the_cycles_clock_not_at_its_commit_time() -> None:
    """The core decides with its clock taken when the cycle starts; the service commits the
    cycle's events a moment later (0.02-0.37 s in a storm), and that commit time is all a log
    showed. A job ending exactly when the head's reservation starts, by the cycle's clock, may
    backfill; judged at the commit time it seemed to run past the start (62 false reports)."""
    history = History("2x8:2:1")
    history.submit(a_job().gpus(8).estimate(3600))
    history.run()
    history.advance(99)
    head, short = history.submit(a_job().gpus(8).tasks(2), a_job().gpus(8).estimate(3500))

    history.cycle(commit_delay_s=0.25)

    [planned] = history.events(ReservationPlanned, head)
    assert planned.start_at == datetime.fromtimestamp(T0 + 3600, UTC)
    assert {r.node_id for r in history.gang(short).ranks} <= set(planned.nodes)
    assert history.auditor.violations == []


@settings(max_examples=60, deadline=None)
@given(
    start=st.floats(min_value=0.0, max_value=1.0),
    delay=st.floats(min_value=0.0, max_value=0.5),
    offset=st.floats(min_value=0.0, max_value=1e-5),
)
def test_what_the_core_backfills_at_its_clock_keeps_the_backfill_rule(
    start: float, delay: float, offset: float
) -> None:
    """However late the cycle's events commit, and whatever fractions of a microsecond the
    clock and the estimates hold (the log keeps times to the microsecond), a job the core lets
    end exactly when the head's reservation starts is no backfill violation."""
    history = History("2x8:2:1", start=T0 + start)
    history.submit(a_job().gpus(8).estimate(3600 + offset))
    history.run()
    history.advance(99)
    head, _ = history.submit(a_job().gpus(8).tasks(2), a_job().gpus(8).estimate(3500 + offset))

    history.cycle(commit_delay_s=delay)

    assert history.events(ReservationPlanned, head)
    assert history.auditor.violations == []


def test_a_backfill_past_the_start_at_the_cycles_clock_still_breaks_the_rule() -> None:
    """The recorded clock spares the cycle's latency only: a job that would run a second past
    the start by the cycle's own clock is reported, worded as any other report."""
    recorded = T + len(_reserved_head(*job("long"))) - 1
    clock = recorded - 3  # decided 3 s before its events were recorded
    head = _reserved_head(*job("long", estimated_runtime_s=T + 3600 - clock + 1))
    planned = head[-1]
    assert isinstance(planned, ReservationPlanned)
    head[-1] = planned.model_copy(update={"decided_at": datetime.fromtimestamp(clock, UTC)})
    events = [*head, gang("long", ("n0001", WHOLE))]

    [violation] = audit(events, one_cycle_from=len(head) - 1)

    assert violation.rule == "backfill"
    assert "reserved for job head" in violation.message
    assert "recorded time" not in violation.message


def test_a_reservation_recorded_without_its_cycles_clock_is_judged_at_its_recorded_time() -> None:
    """Records written before the clock was: the recorded time is the latest the cycle can
    have decided, so a report may be one of the cycle's latency, and says how it was judged."""
    head = _reserved_head(*job("long", estimated_runtime_s=3600 - 2))
    planned = head[-1]
    assert isinstance(planned, ReservationPlanned) and planned.decided_at is None
    events = [*head, gang("long", ("n0001", WHOLE))]

    [violation] = audit(events, one_cycle_from=len(head) - 1)

    assert violation.rule == "backfill"
    assert "judged at the recorded time" in violation.message


# ---------------------------------------------------------------- host ceilings


def capped(name: str, parent: str | None = None, **ceilings: int) -> QueueConfigured:
    return QueueConfigured(name=name, parent=parent, guaranteed_gpus=0, **ceilings)


def cpu_job(job_id: str, team: str, cpus: int, memory_mb: int = 0) -> list[Event]:
    return job(
        job_id,
        team=team,
        gpus_per_task=0,
        cpus_per_task=cpus,
        memory_mb_per_task=memory_mb or None,
    )


def test_gangs_past_a_queue_cpu_ceiling_break_the_host_ceiling_rule() -> None:
    cluster = list(parse_cluster_spec("2x8"))
    history = [
        *cluster,
        team("t"),
        capped("t", max_cpus=10),
        *cpu_job("a", "t", cpus=6),
        gang("a", ("n0000", [])),
        *cpu_job("b", "t", cpus=6),
        gang("b", ("n0001", [])),
    ]
    [violation] = audit(history)
    assert violation.rule == "host_ceiling"
    assert "queue t's CPUs to 12, past its ceiling of 10" in violation.message


def test_a_parent_memory_ceiling_holds_its_children_together() -> None:
    cluster = list(parse_cluster_spec("2x8"))
    history = [
        *cluster,
        capped("org", max_memory_mb=1000),
        team("a"),
        capped("a", parent="org"),
        team("b"),
        capped("b", parent="org"),
        *cpu_job("x", "a", cpus=1, memory_mb=600),
        gang("x", ("n0000", [])),
        *cpu_job("y", "b", cpus=1, memory_mb=600),
        gang("y", ("n0001", [])),
    ]
    [violation] = audit(history)
    assert violation.rule == "host_ceiling" and "queue org's memory to 1200" in violation.message


def test_what_an_ended_gang_held_is_given_back_under_the_ceiling() -> None:
    cluster = list(parse_cluster_spec("2x8"))
    history = [
        *cluster,
        team("t"),
        capped("t", max_cpus=10, max_memory_mb=100),
        *cpu_job("a", "t", cpus=6, memory_mb=60),
        gang("a", ("n0000", [])),
        JobRequeued(job_id="a", attempt=1, code="preempted", reason="preempted"),
        *cpu_job("b", "t", cpus=6, memory_mb=60),
        gang("b", ("n0001", [])),
    ]
    assert audit(history) == []


def test_a_queue_whose_slices_and_shares_fill_its_guarantee_is_not_reclaiming() -> None:
    """The core's quota book counts a queue's shares: 8 whole GPUs and 1.5 GPUs of shares
    put `ops` past its 16 guaranteed once `urgent` asks 8 more, so `urgent` (research) may
    not reclaim the lender's research gang and evicting its own best-effort gang is right."""
    before = [
        *parse_cluster_spec("3x8:2:1"),
        team("ops", guaranteed=16),
        team("lender"),
        *job("mine", team="ops", priority="best-effort"),
        *running("mine", ("n0000", WHOLE)),
        *job("borrowed", team="lender", priority="research"),
        *running("borrowed", ("n0001", WHOLE)),
    ]
    after = [*job("urgent", team="ops", priority="research"), preempt("mine", "urgent")]
    shares = [
        *job("s1", team="ops", gpus_per_task=1),
        share_on("s1", "n0002", 0, 750),
        *job("s2", team="ops", gpus_per_task=1),
        share_on("s2", "n0002", 1, 750),
    ]
    # The same with n0002 held by a gang no one may evict instead of the shares.
    steady = [
        team("third"),
        *job("steady", team="third", priority="production", preemptible=False),
        *running("steady", ("n0002", WHOLE)),
    ]

    assert audit([*before, *shares, *after]) == []
    assert rules(audit([*before, *steady, *after])) == {"borrowers_first"}


def test_a_backfill_is_judged_with_what_was_learned_before_its_cycle() -> None:
    """The cycle ends a job (its JobSucceeded, recorded with its placements) and backfills one
    that ends when the head's reservation starts. The core planned with the runtimes learned
    before the cycle; the auditor learned from the cycle's own JobSucceeded first (a third
    sample: its team's estimates now scaled by 2) and reported a backfill past the start."""
    history = History("2x8:2:1")
    overran = history.submit(*(a_job().team("a").gpus(8).estimate(100) for _ in range(2)))
    history.run()
    history.advance(199)
    for job_id in overran:
        history.exit(job_id)
    history.run()  # two samples of the team's estimates, each half what ran: no ratio yet
    assert history.state.estimates.estimate_ratio("a") is None

    last = history.submit(a_job().team("a").gpus(8).estimate(100))[0]
    history.submit(a_job().team("b").gpus(8).estimate(260))
    history.run()
    history.advance(199)
    head, short = history.submit(
        a_job().team("a").gpus(8).tasks(2), a_job().team("a").gpus(8).estimate(60)
    )
    history.exit(last)

    decisions = history.cycle()

    assert any(isinstance(e, JobSucceeded) and e.job_id == last for e in decisions)
    assert history.events(ReservationPlanned, head)
    assert history.gang(short)
    assert history.auditor.violations == []
