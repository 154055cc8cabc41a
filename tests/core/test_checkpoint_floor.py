"""The work an eviction loses counts the checkpoint service's floor (core/checkpointing.py:
`declared_interval_s`): a gang declaring checkpoints more often than the service's minimum
interval is checkpointed only that often, so more of its work is at stake than its declared
interval says, and preemption for fairness weighs that."""

from __future__ import annotations

from core import SchedulingPolicy
from core.checkpointing import SERVICE_MIN_INTERVAL_S, declared_interval_s
from core.fairness import lost_work_s
from schemas.jobs import JobSpec, PreemptionRequested
from services.checkpoint.settings import CheckpointSettings
from tests.core.builders import History, a_job

# A checkpoint slower than the grace period (300 s against 120 s): an eviction falls back to
# the victim's last periodic checkpoint, so the interval decides the work lost.
SLOW_WRITE = SchedulingPolicy(
    fairness_preemption=True,
    las_thresholds_gpu_s=(3600.0, 36_000.0),
    checkpoint_write_estimate_s=300.0,
)


def _spec(interval: float | str | None) -> JobSpec:
    builder = a_job().gpus(8)
    if interval is not None:
        builder = builder.checkpoint_every(interval)  # type: ignore[arg-type]
    history = History("1x8:1:1")
    job = history.submit(builder)[0]
    spec = history.state.job_records[job].spec
    assert spec is not None
    return spec


def test_the_floor_is_the_checkpoint_services_default() -> None:
    assert CheckpointSettings().checkpoint_min_interval_s == SERVICE_MIN_INTERVAL_S == 60.0


def test_a_declared_interval_below_the_floor_is_checkpointed_at_the_floor() -> None:
    assert declared_interval_s(_spec(10.0)) == SERVICE_MIN_INTERVAL_S
    assert declared_interval_s(_spec(60.0)) == 60.0
    assert declared_interval_s(_spec(1800.0)) == 1800.0
    # No periodic checkpoints, or an interval chosen per gang: none declared.
    assert declared_interval_s(_spec(None)) is None
    assert declared_interval_s(_spec("auto")) is None
    assert declared_interval_s(None) is None


def test_lost_work_runs_from_the_last_checkpoint_the_service_took() -> None:
    history = History("1x8:1:1")
    job = history.submit(a_job().gpus(8).checkpoint_every(10.0))[0]
    victim = history.state.job_records[job]
    # Checkpoints at 60 s, 120 s, ... 600 s: 50 s since the last at 650 s (not 0: every 10 s).
    assert lost_work_s(victim, 650.0, 300.0, 120.0) == 50.0
    # A write within the grace loses nothing, whatever the interval.
    assert lost_work_s(victim, 650.0, 60.0, 120.0) == 0.0


def _fairness_at(run_s: float, interval_s: float) -> list[PreemptionRequested]:
    """A team's 8-GPU gang declaring `interval_s` has run `run_s` when a 8-GPU job of the
    same team arrives: does preemption for fairness evict it then?"""
    history = History("1x8:1:1", policy=SLOW_WRITE).team("alpha", guaranteed=8, max_gpus=8)
    history.submit(a_job().gpus(8).team("alpha").checkpoint_every(interval_s))
    history.run()
    history.advance(run_s)
    history.submit(a_job().gpus(8).team("alpha"))
    history.run()
    return history.events(PreemptionRequested)


def test_fairness_weighs_the_work_since_the_services_last_checkpoint() -> None:
    # At 650 s a gang checkpointed every 130 s loses nothing: cost 8 GPUs x 300 s, repaid
    # (x2) by the waiting job's 8 GPUs after 600 s. One declaring 10 s is checkpointed every
    # 60 s and would lose 50 s: 8 x 350 s, repaid only after 700 s; not yet.
    assert [r.code for r in _fairness_at(650.0, 130.0)] == ["fairness"]
    assert _fairness_at(650.0, 10.0) == []
    assert [r.code for r in _fairness_at(710.0, 10.0)] == ["fairness"]
