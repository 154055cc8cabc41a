"""Whole GPUs back from slices and shares (core/sharing_reclaim.py): a whole-GPU gang of a
higher class, with no whole GPU to be had, has the lower-class slices and shares that hold the
GPUs it needs checkpointed and evicted; a GPU in MIG mode goes back to whole once its slices
are gone (a re-partition with its cost), and the gang starts then. It never takes an equal or
higher class, protected work, or another queue's slices within its guarantee; nothing flaps."""

from __future__ import annotations

from core.cycle import schedule
from schemas.jobs import GangReserved, JobRequeued, PreemptionRequested
from schemas.nodes import GpuGeometryChanged
from tests.core.builders import History, JobBuilder, a_job
from tests.core.test_live_sharing import a_share, a_slice, audit_clean, one_h100


def sliced_node(history: History, *builders: JobBuilder) -> list[str]:
    """The node's GPUs cut into 1g slices and every slice running; 1,000 s later (past the
    geometry's hold, so the re-partition planner would cut the GPUs back once idle)."""
    slices = history.submit(*builders)
    history.run()
    history.advance(60).run()
    assert all(history.job(job).state == "running" for job in slices)
    history.advance(1000).run()
    return slices


def research_slices(count: int, team: str = "lab") -> list[JobBuilder]:
    return [a_slice(team=team).priority("research") for _ in range(count)]


def an_8_gpu_gang(team: str = "lab", priority: str = "production") -> JobBuilder:
    return a_job().gpus(8).team(team).priority(priority)


def test_a_production_gang_gets_a_node_fully_sliced_by_research_work() -> None:
    history = History(cluster=one_h100(gpus=8))
    slices = sliced_node(history, *research_slices(56))
    gang = history.submit(an_8_gpu_gang())[0]
    history.run()

    requests = history.events(PreemptionRequested)
    assert sorted(r.job_id for r in requests) == sorted(slices)
    assert {r.preemptor_job_id for r in requests} == {gang}
    assert {r.code for r in requests} == {"priority"}
    assert all(r.grace_s == history.policy.preemption_grace_s for r in requests)
    waiting = history.deferrals(gang)[-1]
    assert waiting.code == "preempting"
    assert "slices and shares on 8 GPUs it needs" in waiting.message, waiting.message
    assert "leave MIG mode" in waiting.message

    for job in slices:
        history.evict(job)
    history.run()
    # Their instances are destroyed and every GPU leaves MIG mode, at once, for the gang.
    cuts = [e for e in history.events(GpuGeometryChanged) if not e.geometry]
    assert sorted(e.gpu_index for e in cuts) == list(range(8))
    assert all(f"for job {gang}" in e.reason for e in cuts)
    assert all(history.job(job).state == "queued" for job in slices)
    waiting = history.deferrals(gang)[-1]
    assert waiting.code == "awaiting_repartition", waiting
    assert "leaving MIG mode" in waiting.message and "ready at" in waiting.message

    history.advance(60).run()
    assert history.job(gang).state == "running"
    assert history.job(gang).placement == {"n0000": list(range(8))}
    audit_clean(history)


def test_nothing_flaps_once_the_gang_runs() -> None:
    """The requeued slices wait; no one is evicted twice; no GPU is cut again under the gang;
    once it ends, the slices come back."""
    history = History(cluster=one_h100(gpus=8))
    slices = sliced_node(history, *research_slices(56))
    gang = history.submit(an_8_gpu_gang().estimate(3600))[0]
    history.run()
    for job in slices:
        history.evict(job)
    history.run()
    history.advance(60).run()
    assert history.job(gang).state == "running"
    requests = len(history.events(PreemptionRequested))
    cuts = len(history.events(GpuGeometryChanged))
    for _ in range(20):
        history.advance(300).run()
    assert len(history.events(PreemptionRequested)) == requests == len(slices)
    assert len(history.events(GpuGeometryChanged)) == cuts
    assert history.job(gang).state == "running"
    assert len(history.events(JobRequeued)) == len(slices)

    history.exit(gang)
    history.run()
    history.advance(60).run()
    assert all(history.job(job).state == "running" for job in slices)
    audit_clean(history)


def test_soft_shared_gpus_are_whole_again_as_soon_as_their_shares_leave() -> None:
    history = History(cluster=one_h100(mig="none", gpus=2))
    shares = history.submit(*(a_share(0.5, team="lab").priority("research") for _ in range(4)))
    history.run()
    history.advance(1000).run()
    assert all(history.job(job).state == "running" for job in shares)
    gang = history.submit(a_job().gpus(2).team("lab").priority("production"))[0]
    history.run()
    assert sorted(r.job_id for r in history.events(PreemptionRequested)) == sorted(shares)
    for job in shares:
        history.evict(job)
    history.run()
    assert history.job(gang).state == "running"
    assert not history.events(GpuGeometryChanged)
    audit_clean(history)


def test_only_the_gpus_it_needs_the_least_lost_work_first() -> None:
    """A 1-GPU gang on a node of two soft-shared GPUs: the GPU whose shares lose the least
    work is emptied, the other is left alone."""
    history = History(cluster=one_h100(mig="none", gpus=2))
    checkpointed = history.submit(
        *(a_share(0.5, team="lab").priority("research").checkpoint_every(300) for _ in range(2))
    )
    history.run()
    history.advance(1000).run()
    later = history.submit(*(a_share(0.5, team="lab").priority("research") for _ in range(2)))
    history.run()
    history.advance(700).run()
    assert all(history.job(j).state == "running" for j in [*checkpointed, *later])
    gpus = {history.gang(j).ranks[0].gpus[0] for j in checkpointed}
    assert len(gpus) == 1 and gpus != {history.gang(j).ranks[0].gpus[0] for j in later}
    gang = history.submit(a_job().gpus(1).team("lab").priority("production"))[0]
    history.run()
    # 200 s since their checkpoint on half a GPU each (200 GPU-s) against 700 s each (700).
    assert sorted(r.job_id for r in history.events(PreemptionRequested)) == sorted(checkpointed)
    for job in checkpointed:
        history.evict(job)
    history.run()
    assert history.job(gang).placement == {"n0000": sorted(gpus)}
    assert all(history.job(j).state == "running" for j in later)
    audit_clean(history)


def test_never_an_equal_or_higher_class() -> None:
    history = History(cluster=one_h100(gpus=8))
    sliced_node(
        history,
        *(a_slice(team="lab").priority("production") for _ in range(28)),
        *(a_slice(team="lab").priority("inference-critical") for _ in range(28)),
    )
    gang = history.submit(an_8_gpu_gang())[0]
    history.run(3)
    assert not history.events(PreemptionRequested)
    assert history.job(gang).state == "queued"


def test_never_protected_work() -> None:
    """Non-preemptible slices, and slices younger than their minimum runtime, stay; a GPU
    with one of them is no GPU to get back."""
    history = History(cluster=one_h100(gpus=2))
    kept = [a_slice(team="lab").priority("research").preemptible(False) for _ in range(7)]
    young = [a_slice(team="lab").priority("research").min_runtime(86_400) for _ in range(7)]
    sliced_node(history, *kept, *young)
    gang = history.submit(a_job().gpus(1).team("lab").priority("production"))[0]
    history.run(3)
    assert not history.events(PreemptionRequested)
    assert history.job(gang).state == "queued"


def test_never_another_queues_slices_within_its_guarantee() -> None:
    """Team lab's slices within its guarantee are safe from team prod's gang, whatever its
    class; once lab borrows, its slices beyond the guarantee are fair game."""
    history = History(cluster=one_h100(gpus=2))
    history.team("lab", guaranteed=2).team("prod", guaranteed=0)
    sliced_node(history, *research_slices(14))
    gang = history.submit(a_job().gpus(1).team("prod").priority("production"))[0]
    history.run(3)
    assert not history.events(PreemptionRequested)
    assert history.job(gang).state == "queued"

    history.queue("lab", guaranteed=1)  # lab now borrows one GPU of slices
    history.advance(1000).run()
    taken = history.events(PreemptionRequested)
    assert len(taken) == 7
    assert {history.job(r.job_id).team for r in taken} == {"lab"}
    assert {r.preemptor_job_id for r in taken} == {gang}


def test_a_fixed_geometry_never_goes_whole_and_a_recent_cut_is_kept() -> None:
    fixed = History(cluster=one_h100(mig="[" + ", ".join(["1g.10gb"] * 7) + "]"))
    fixed_slices = fixed.submit(*research_slices(7))
    fixed.run()
    fixed.advance(1000).run()
    assert all(fixed.job(job).state == "running" for job in fixed_slices)
    gang = fixed.submit(a_job().gpus(1).team("lab").priority("production"))[0]
    fixed.run(3)
    assert not fixed.events(PreemptionRequested)
    assert fixed.job(gang).state == "queued"

    recent = History(cluster=one_h100())
    recent_slices = recent.submit(*research_slices(7))
    recent.run()
    recent.advance(60).run()
    assert all(recent.job(job).state == "running" for job in recent_slices)
    gang = recent.submit(a_job().gpus(1).team("lab").priority("production"))[0]
    recent.advance(100).run()
    assert not recent.events(PreemptionRequested), "the geometry is within its hold"
    recent.advance(600).run()
    assert len(recent.events(PreemptionRequested)) == 7


def test_a_slice_gang_spread_over_more_gpus_than_it_frees_is_not_stopped() -> None:
    """21 slices of one gang on three GPUs: stopping three GPUs' worth of work to free one
    is past the bound (the victims hold at most twice the GPUs emptied)."""
    history = History(cluster=one_h100(gpus=3))
    wide = sliced_node(history, a_slice(team="lab").priority("research").tasks(21))[0]
    gang = history.submit(a_job().gpus(1).team("lab").priority("production"))[0]
    history.run(3)
    assert not history.events(PreemptionRequested)
    assert history.job(gang).state == "queued"
    assert history.job(wide).state == "running"


def test_a_restarted_scheduler_decides_the_same() -> None:
    history = History(cluster=one_h100(gpus=8))
    slices = sliced_node(history, *research_slices(56))
    history.submit(an_8_gpu_gang())
    history.run()
    for job in slices[:30]:
        history.evict(job)
    replayed = history.replayed()
    ours = schedule(history.state, history.now).decisions
    assert schedule(replayed, history.now).decisions == ours
    assert not any(isinstance(e, GangReserved) for e in ours)


def test_a_queue_within_its_guarantee_reclaims_what_slices_borrow_of_any_class() -> None:
    """Team lab, guaranteed nothing, holds two GPUs of production slices; team prod,
    guaranteed two, reclaims one GPU for a research gang: seven slices on one GPU go, with the
    code `reclaim`, and the gang starts once the GPU has left MIG mode."""
    history = History(cluster=one_h100(gpus=2))
    history.team("lab", guaranteed=0).team("prod", guaranteed=2)
    slices = sliced_node(history, *(a_slice(team="lab").priority("production") for _ in range(14)))
    gang = history.submit(a_job().gpus(1).team("prod").priority("research"))[0]
    history.run()
    requests = history.events(PreemptionRequested)
    assert len(requests) == 7
    assert {r.code for r in requests} == {"reclaim"}
    assert all("reclaiming guaranteed capacity" in r.reason for r in requests)
    gpus = {history.gang(r.job_id).ranks[0].gpus[0] for r in requests}
    assert len(gpus) == 1
    for request in requests:
        history.evict(request.job_id)
    history.run()
    history.advance(60).run()
    assert history.job(gang).state == "running"
    assert history.job(gang).placement == {"n0000": sorted(gpus)}
    assert sum(history.job(job).state == "running" for job in slices) == 7
    audit_clean(history)


def test_a_slice_behind_the_head_keeps_off_the_nodes_its_reservation_pins() -> None:
    """Two nodes: the head's reservation pins n0000 (its whole gang ends first), whose other
    GPU is soft-shared with room; a later share of that team waits (backfill_blocked) rather
    than outlive the reservation's start there, and evicts no one for it."""
    history = History(cluster=one_h100(mig="none", gpus=2, count=2))
    history.occupy("n0001", 2, a_job().preemptible(False).estimate(86_400).priority("production"))
    first = history.submit(
        a_share(0.5, team="lab").priority("research").estimate(1000).preemptible(False)
    )[0]
    history.run()
    busy = history.submit(a_job().gpus(1).estimate(600.0).priority("production").preemptible(False))
    history.run()
    assert history.job(first).state == "running" and history.job(busy[0]).state == "running"
    head = history.submit(a_job().gpus(1).priority("production").team("big"))[0]
    late = history.submit(a_share(0.5, team="lab").priority("research").estimate(86_400))[0]
    history.run()
    assert history.job(head).state == "queued"
    assert history.deferrals(head)[-1].code == "reserved_head"
    assert history.job(late).state == "queued"
    assert history.deferrals(late)[-1].code == "backfill_blocked"
    assert not history.events(PreemptionRequested)
    audit_clean(history)


def test_shares_on_pcie_boxes_use_up_no_reclaim_for_tp_gangs_that_cannot_go_there() -> None:
    # The NVLink node is held for good; the PCIe box's two GPUs by research shares. Four tp2
    # gangs wait first: the box is of no use to them, yet each took one of the cycle's
    # reclaiming gangs (MAX_RECLAIMING_GANGS) on the box's GPUs, and the plain 2-GPU gang
    # behind them, which the box would serve, was never planned for.
    history = History(
        "groups:\n"
        "  - {count: 1, gpus: 8, gpu_type: H100}\n"
        "  - {count: 1, gpus: 2, gpu_type: H100, nvlink: false}\n"
    )
    history.occupy("n0000", 8)
    shares = history.submit(*(a_share(0.5, team="lab").priority("research") for _ in range(4)))
    history.run()
    history.advance(1000).run()
    assert all(history.job(job).placement.keys() == {"n0001"} for job in shares)
    history.submit(*(a_job().gpus(2).tp(2).team("lab").priority("production") for _ in range(4)))
    plain = history.submit(a_job().gpus(2).team("lab").priority("production"))[0]

    history.run()

    evictions = history.events(PreemptionRequested)
    assert sorted(r.job_id for r in evictions) == sorted(shares)
    assert {r.preemptor_job_id for r in evictions} == {plain}
    audit_clean(history)
