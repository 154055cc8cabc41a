"""The inference headroom in exact fractions (issue 12 item 5): a slice or share uses part of
it, other classes' slices and shares may not eat into it, and the refill evicts only as much
as is short (a slice, not a whole gang) once an inference slice took its part."""

from __future__ import annotations

from fractions import Fraction

from core import SchedulingPolicy
from schemas.jobs import PreemptionRequested
from schemas.nodes import GpuGeometryChanged
from tests.core.builders import History
from tests.core.test_live_sharing import a_share, a_slice, audit_clean, one_h100, placed_ranks

ONE_GPU_KEPT = SchedulingPolicy(inference_headroom_gpus=1, inference_max_victim_gpus=4)


def test_a_share_of_another_class_may_not_turn_the_last_free_gpu_soft_shared() -> None:
    """Two GPUs, one kept: research shares fill one GPU; the next would need the other."""
    history = History(cluster=one_h100(mig="none", gpus=2), policy=ONE_GPU_KEPT)
    research = history.submit(*(a_share(0.5, team="lab").priority("research") for _ in range(2)))
    history.run()
    assert all(history.job(job).state == "running" for job in research)
    assert {placed_ranks(history, job)[0][1] for job in research} == {0}
    third = history.submit(a_share(0.5, team="lab").priority("research"))[0]
    history.run()
    assert history.job(third).state == "queued"
    assert history.deferrals(third)[-1].code == "inference_headroom"

    serve = history.submit(a_share(0.5, team="serve").priority("inference-critical"))[0]
    history.run()
    assert history.job(serve).state == "running"
    assert placed_ranks(history, serve)[0][1] == 1
    audit_clean(history)


def test_an_inference_slice_takes_a_seventh_of_the_headroom_and_the_refill_one_slice() -> None:
    """Two MIG GPUs, one GPU kept. Best-effort slices fill the first cut GPU; the second is cut
    too, but a best-effort slice there would leave 6/7 free: it waits. An inference slice lands
    at once, leaving 6/7: the refill evicts exactly one best-effort slice (1/7), no more."""
    history = History(cluster=one_h100(mig="dynamic", gpus=2), policy=ONE_GPU_KEPT)
    fillers = history.submit(*(a_slice(team="lab").priority("best-effort") for _ in range(7)))
    history.run()
    history.advance(60).run()
    assert all(history.job(job).state == "running" for job in fillers)
    more = history.submit(a_slice(team="lab").priority("best-effort"))[0]
    history.run()
    history.advance(60).run()
    assert len(history.events(GpuGeometryChanged)) == 2, "the idle GPU is cut for the slice"
    assert history.job(more).state == "queued"
    assert history.deferrals(more)[-1].code == "inference_headroom"
    assert not history.events(PreemptionRequested)

    serve = history.submit(a_slice(team="serve").priority("inference-critical"))[0]
    history.run()
    assert history.job(serve).state == "running"
    victims = history.events(PreemptionRequested)
    assert len(victims) == 1, "1/7 short: one 1g slice is evicted, not a gang"
    assert victims[0].job_id in fillers and victims[0].preemptor_job_id is None
    assert history.state.queue_usage("serve") == Fraction(1, 7)
    audit_clean(history)
