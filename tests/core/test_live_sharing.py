"""Slices and shares in the live cycle (DESIGN §8): the same core the scheduler service and the
simulator drive places MIG slices and soft shares onto parts of one GPU, several jobs per GPU,
re-partitions GPUs as recorded decisions with their cost, and counts what each holds exactly."""

from __future__ import annotations

from fractions import Fraction

from core.live_sharing import job_gpus
from schemas.jobs import GangReserved
from schemas.nodes import GpuGeometryChanged
from tests.core.builders import History, JobBuilder, a_job


def one_h100(mig: str = "dynamic", gpus: int = 1, count: int = 1) -> str:
    return (
        "groups:\n"
        f"  - {{count: {count}, gpus: {gpus}, gpu_type: H100, mig: {mig}, reconfigure_s: 60}}\n"
    )


def a_slice(profile: str = "1g.10gb", team: str = "team-a") -> JobBuilder:
    return a_job()._set(mig_profile=profile, gpus_per_task=0).team(team)


def a_share(fraction: float, team: str = "team-a") -> JobBuilder:
    return a_job()._set(gpu_fraction=fraction, gpus_per_task=0).team(team)


def placed_ranks(history: History, job_id: str) -> list[tuple[str, int, object]]:
    gang = history.gang(job_id)
    return [(rank.node_id, rank.gpus[0], rank.mig or rank.share) for rank in gang.ranks]


def audit_clean(history: History) -> None:
    assert history.auditor.violations == [], history.auditor.violations
    assert history.state.sharing.ledger.problems() == []


def test_seven_1g_slices_of_seven_teams_share_one_h100() -> None:
    history = History(cluster=one_h100())
    jobs = history.submit(*(a_slice(team=f"team-{n}") for n in range(7)))
    history.run()
    geometry = history.events(GpuGeometryChanged)
    assert len(geometry) == 1, "one re-partition cuts the idle GPU for the waiting slices"
    assert geometry[0].reconfigure_s == 60
    assert {i.profile for i in geometry[0].geometry} == {"1g.10gb"}
    assert len(geometry[0].geometry) == 7
    assert all(history.job(j).state == "queued" for j in jobs)
    waiting = history.deferrals(jobs[0])[-1]
    assert waiting.code == "awaiting_repartition"
    assert "re-partition of n0000 GPU 0 is planned" in waiting.message, waiting.message

    history.advance(60).run()
    assert all(history.job(j).state == "running" for j in jobs)
    places = [placed_ranks(history, j)[0] for j in jobs]
    assert {(node, gpu) for node, gpu, _ in places} == {("n0000", 0)}
    assert sorted(getattr(s, "start", -1) for _, _, s in places) == list(range(7))
    # Exact accounting: seven sevenths are one GPU; each team holds 1/7.
    assert history.state.allocated_gpus == 1
    for n in range(7):
        assert history.state.queue_usage(f"team-{n}") == Fraction(1, 7)
    audit_clean(history)


def test_four_mps_shares_of_one_team_share_a_gpu_a_second_team_is_refused() -> None:
    history = History(cluster=one_h100(mig="none"))
    ours = history.submit(*(a_share(0.25, team="lab") for _ in range(4)))
    history.run()
    assert all(history.job(j).state == "running" for j in ours)
    places = [placed_ranks(history, j)[0] for j in ours]
    assert {(node, gpu) for node, gpu, _ in places} == {("n0000", 0)}
    share = places[0][2]
    assert getattr(share, "thousandths", None) == 250
    assert getattr(share, "sharing", None) == "mps"
    assert getattr(share, "memory_mb", None) == 81_559 // 4
    assert history.state.allocated_gpus == 1

    history.exit(ours[0])
    history.run()
    other = history.submit(a_share(0.25, team="other"))[0]
    history.run()
    assert history.job(other).state == "queued"
    why = history.deferrals(other)[-1]
    assert why.code == "share_other_team", why
    assert "soft-shared by another team" in why.message
    assert "lab" not in why.message  # the waiting team never learns who else runs there
    # The team's own next share takes the room its finished job left.
    again = history.submit(a_share(0.25, team="lab"))[0]
    history.run()
    assert history.job(again).state == "running"
    audit_clean(history)


def test_a_share_of_another_team_goes_to_another_gpu_when_one_is_whole() -> None:
    history = History(cluster=one_h100(mig="none", gpus=2))
    first = history.submit(a_share(0.5, team="lab"))[0]
    history.run()
    second = history.submit(a_share(0.5, team="other"))[0]
    history.run()
    (_, gpu_a, _), (_, gpu_b, _) = placed_ranks(history, first)[0], placed_ranks(history, second)[0]
    assert gpu_a != gpu_b
    audit_clean(history)


def test_a_repartition_waits_for_the_gpu_to_drain_and_its_cost_is_in_the_log() -> None:
    history = History(cluster=one_h100())
    trainer = history.submit(a_job().gpus(1).estimate(3600))[0]
    history.run()
    assert history.job(trainer).state == "running"
    infer = history.submit(a_slice("3g.40gb"))[0]
    history.run()
    assert not history.events(GpuGeometryChanged), "never re-partition a GPU that holds work"
    why = history.deferrals(infer)[-1]
    assert why.code == "no_mig_slice"
    assert "no H100 has slots 0-3 or 4-7 free" in why.message, why.message

    history.exit(trainer)
    history.run()
    changed = history.events(GpuGeometryChanged)
    assert len(changed) == 1 and changed[0].reconfigure_s == 60
    cut_at = history.now - 1.0
    assert history.job(infer).state == "queued"
    history.advance(30).run()
    assert history.job(infer).state == "queued", "the GPU serves nothing while it is re-cut"
    history.advance(30).run()
    assert history.job(infer).state == "running"
    reserved_at = [at for e, at in history.log if isinstance(e, GangReserved)][-1]
    assert reserved_at >= cut_at + 60
    audit_clean(history)


def test_a_whole_gpu_comes_back_for_a_gang_after_the_hysteresis() -> None:
    history = History(cluster=one_h100())
    infer = history.submit(a_slice())[0]
    history.run()
    history.advance(60).run()
    assert history.job(infer).state == "running"
    history.exit(infer)
    trainer = history.submit(a_job().gpus(1))[0]
    history.run()
    assert len(history.events(GpuGeometryChanged)) == 1, "hysteresis: no flap back at once"
    assert history.job(trainer).state == "queued"
    history.advance(600).run()
    changes = history.events(GpuGeometryChanged)
    assert len(changes) == 2 and changes[-1].geometry == []
    history.advance(60).run()
    assert history.job(trainer).state == "running"
    audit_clean(history)


def test_a_gang_still_finds_a_whole_node_while_slices_come_and_go() -> None:
    history = History(cluster=one_h100(gpus=8, count=2))
    slices = history.submit(*(a_slice(team=f"t{n}") for n in range(3)))
    history.run()
    history.advance(60).run()
    assert all(history.job(j).state == "running" for j in slices)
    gang = history.submit(a_job().gpus(8).team("train"))[0]
    history.run()
    assert history.job(gang).state == "running"
    sliced_node = placed_ranks(history, slices[0])[0][0]
    assert list(history.job(gang).placement) != [sliced_node]
    for job in slices:
        history.exit(job)
    more = history.submit(*(a_slice(team=f"u{n}") for n in range(2)))
    history.run()
    assert all(history.job(j).state == "running" for j in more)
    assert {placed_ranks(history, j)[0][0] for j in more} == {sliced_node}
    audit_clean(history)


def test_a_queue_ceiling_counts_slices_in_exact_sevenths() -> None:
    history = History(
        cluster=one_h100(
            mig="[1g.10gb, 1g.10gb, 1g.10gb, 1g.10gb, 1g.10gb, 1g.10gb, 1g.10gb]", gpus=2
        )
    )
    history.team("serve", max_gpus=1)
    jobs = history.submit(*(a_slice(team="serve") for _ in range(8)))
    history.run()
    states = [history.job(j).state for j in jobs]
    assert states.count("running") == 7
    last = history.deferrals(jobs[7])[-1]
    assert last.code == "quota_ceiling", last
    assert history.state.queue_usage("serve") == 1
    spec = history.state.job_records[jobs[0]].spec
    assert spec is not None and job_gpus(spec) == Fraction(1, 7)


def test_a_slice_nothing_can_ever_hold_is_unsatisfiable() -> None:
    history = History(cluster=one_h100(mig="none"))
    job = history.submit(a_slice())[0]
    history.run()
    why = history.deferrals(job)[-1]
    assert why.code == "unsatisfiable"
    assert "no node offers 1g.10gb slices" in why.message


def test_a_share_asking_more_gpu_memory_than_any_gpu_has_is_unsatisfiable() -> None:
    # An H100 has 81,559 MB: a share asking a terabyte can never be placed, whatever is free;
    # it must not wait forever under a reason that blames the other team or busy GPUs.
    history = History(cluster=one_h100(mig="none", gpus=2))
    history.submit(a_share(0.5, team="other"))
    huge = history.submit(a_share(0.25, team="lab")._set(gpu_memory_mb=1_048_576))[0]
    history.run()
    assert history.job(huge).state == "queued"
    why = history.deferrals(huge)[-1]
    assert why.code == "unsatisfiable", why
    assert "1048576 MB" in why.message and "81559 MB" in why.message, why.message
    # The same share with room in memory is placed: the rule is per ask, not per kind.
    fits = history.submit(a_share(0.25, team="lab")._set(gpu_memory_mb=20_000))[0]
    history.run()
    assert history.job(fits).state == "running"


def test_a_replayed_log_binds_the_same_slices_and_shares() -> None:
    history = History(cluster=one_h100(gpus=2))
    history.submit(a_slice(), a_slice("2g.20gb"), a_share(0.5, team="lab"))
    history.run()
    history.advance(60).run()
    replayed = history.replayed()
    assert (
        replayed.allocated_gpus
        == history.state.allocated_gpus
        == Fraction(1, 7) + Fraction(2, 7) + Fraction(1, 2)
    )
    live = history.state.sharing.ledger
    again = replayed.sharing.ledger
    for node_id, node in live.nodes.items():
        for gpu, other in zip(node.gpus, again.nodes[node_id].gpus, strict=True):
            assert (gpu.geometry, gpu.slices, gpu.shares) == (
                other.geometry,
                other.slices,
                other.shares,
            )


def test_a_slice_whose_gpu_breaks_is_requeued_and_placed_again_elsewhere() -> None:
    history = History(cluster=one_h100(gpus=2))
    job = history.submit(a_slice())[0]
    history.run()
    history.advance(60).run()
    node_id, gpu, _ = placed_ranks(history, job)[0]
    history.break_gpu(node_id, gpu)
    history.run()
    requeued = [e for e, _ in history.log if getattr(e, "code", None) == "gpu_unhealthy"]
    assert requeued, "the slice's gang is released when its GPU breaks"
    history.advance(60).run(cycles=3)  # its retry backoff, then GPU 1 is cut for it
    history.advance(60).run()
    assert history.job(job).state == "running"
    assert placed_ranks(history, job)[0][1] != gpu
    audit_clean(history)
