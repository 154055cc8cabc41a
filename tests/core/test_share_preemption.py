"""Preemption for slices and shares (core/share_preemption.py): an inference-critical slice or
share on a full cluster has a preemptible slice, share or small gang checkpointed and evicted,
the least lost work first, never a gang above the blast radius; a soft-shared GPU never hosts
two teams on the way; a restarted scheduler decides the same."""

from __future__ import annotations

from core import SchedulingPolicy
from core.cycle import schedule
from schemas.jobs import PreemptionRequested
from tests.core.builders import History, a_job
from tests.core.test_live_sharing import a_share, a_slice, audit_clean, one_h100, placed_ranks

RADIUS_1 = SchedulingPolicy(inference_max_victim_gpus=1)


def full_h100_of_research_slices(history: History) -> list[str]:
    """Seven research 1g slices of team lab, one checkpointing every 300 s; 1,000 s later."""
    slices = history.submit(
        *(a_slice(team="lab").priority("research") for _ in range(6)),
        a_slice(team="lab").priority("research").checkpoint_every(300),
    )
    history.run()
    history.advance(60).run()
    assert all(history.job(job).state == "running" for job in slices)
    history.advance(1000).run()
    return slices


def test_an_inference_slice_evicts_the_slice_with_the_least_lost_work() -> None:
    history = History(cluster=one_h100())
    slices = full_h100_of_research_slices(history)
    serve = history.submit(a_slice(team="serve").priority("inference-critical"))[0]
    history.run()
    victims = history.events(PreemptionRequested)
    # All seven ran 1,000 s; the one checkpointing every 300 s loses 100 s of it, the others
    # all 1,000: it is the one taken, and only it (a seventh of a GPU for a seventh).
    assert [v.job_id for v in victims] == [slices[-1]]
    assert victims[0].preemptor_job_id == serve
    assert history.deferrals(serve)[-1].code == "preempting"

    history.evict(slices[-1])
    history.run()
    assert history.job(serve).state == "running"
    assert placed_ranks(history, serve)[0][:2] == ("n0000", 0)
    assert all(history.job(job).state == "running" for job in slices[:-1])
    audit_clean(history)


def test_a_slice_of_the_same_class_evicts_no_one() -> None:
    history = History(cluster=one_h100())
    full_h100_of_research_slices(history)
    late = history.submit(a_slice(team="other").priority("research"))[0]
    history.run()
    assert not history.events(PreemptionRequested)
    assert history.job(late).state == "queued"


def test_an_inference_share_takes_a_whole_gpu_from_the_smaller_gang_only() -> None:
    """Two GPUs: a 1-GPU research gang on one, a 1-GPU research gang on the other, the
    blast radius 1 GPU: the inference share evicts one of them (the one with less lost work),
    not both; with a 2-GPU gang there it evicts nothing."""
    history = History(cluster=one_h100(mig="none", gpus=2), policy=RADIUS_1)
    old = history.submit(a_job().gpus(1).priority("research"))[0]
    history.run()
    history.advance(500)
    young = history.submit(a_job().gpus(1).priority("research"))[0]
    history.run()
    history.advance(100)
    serve = history.submit(a_share(0.5, team="serve").priority("inference-critical"))[0]
    history.run()
    victims = history.events(PreemptionRequested)
    assert [v.job_id for v in victims] == [young]
    history.evict(young)
    history.run()
    assert history.job(serve).state == "running"
    assert history.job(old).state == "running"
    audit_clean(history)


def test_no_gang_above_the_blast_radius_is_evicted_for_a_share() -> None:
    history = History(cluster=one_h100(mig="none", gpus=2), policy=RADIUS_1)
    wide = history.submit(a_job().gpus(2).priority("research"))[0]
    history.run()
    serve = history.submit(a_share(0.5, team="serve").priority("inference-critical"))[0]
    history.run()
    assert history.job(wide).state == "running"
    assert not history.events(PreemptionRequested)
    assert history.job(serve).state == "queued"


def test_a_hostile_teams_share_never_lands_beside_another_teams_and_evicts_no_one_for_it() -> None:
    """One GPU soft-shared by team lab: two preemptible research shares and one that may not
    be preempted. Evicting the two would still leave lab on the GPU, so a share of another
    team could never land there: nothing is evicted, and it waits."""
    history = History(cluster=one_h100(mig="none", gpus=1))
    preemptible = history.submit(
        *(a_share(0.25, team="lab").priority("research") for _ in range(2))
    )
    kept = history.submit(a_share(0.25, team="lab").priority("research").preemptible(False))[0]
    history.run()
    assert all(history.job(job).state == "running" for job in [*preemptible, kept])
    history.advance(1000).run()
    hostile = history.submit(a_share(0.25, team="hostile").priority("inference-critical"))[0]
    history.run(3)
    assert not history.events(PreemptionRequested)
    assert history.job(hostile).state == "queued"
    assert history.deferrals(hostile)[-1].code == "share_other_team"
    audit_clean(history)


def test_an_inference_share_evicts_every_share_of_the_other_team_on_its_gpu() -> None:
    """A soft-shared GPU hosts one team: to share it, all of lab's shares there must go."""
    history = History(cluster=one_h100(mig="none", gpus=1))
    lab = history.submit(*(a_share(0.25, team="lab").priority("research") for _ in range(2)))
    history.run()
    history.advance(1000).run()
    serve = history.submit(a_share(0.25, team="serve").priority("inference-critical"))[0]
    history.run()
    assert sorted(v.job_id for v in history.events(PreemptionRequested)) == sorted(lab)
    history.evict(lab[0])
    history.run()
    assert history.job(serve).state == "queued", "never beside a share of another team"
    history.evict(lab[1])
    history.run()
    assert history.job(serve).state == "running"
    audit_clean(history)


def test_a_restarted_scheduler_folds_the_same_ledger_and_preempts_the_same() -> None:
    history = History(cluster=one_h100())
    full_h100_of_research_slices(history)
    history.submit(a_slice(team="serve").priority("inference-critical"))
    replayed = history.replayed()
    live, again = history.state.sharing.ledger, replayed.sharing.ledger
    assert {h: s for h, (_, s) in live.holders.items()} == {
        h: s for h, (_, s) in again.holders.items()
    }
    assert again.held_mix == live.held_mix
    ours = schedule(history.state, history.now).decisions
    assert any(isinstance(event, PreemptionRequested) for event in ours)
    assert schedule(replayed, history.now).decisions == ours
