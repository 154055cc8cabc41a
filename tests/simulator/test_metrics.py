"""Metric arithmetic on hand-made records (the core is not involved)."""

from __future__ import annotations

import pytest

from gangway.simulator.metrics import SimJobMetrics, compute_metrics, percentile


def record(
    job_id: str,
    submit: float,
    start: float | None,
    finish: float | None,
    *,
    tenant: str = "a",
    priority: str = "research",
    gpus: int = 1,
) -> SimJobMetrics:
    return SimJobMetrics(
        job_id=job_id,
        tenant=tenant,
        priority=priority,
        num_gpus=gpus,
        submit_s=submit,
        first_start_s=start,
        finish_s=finish,
        outcome="succeeded" if finish is not None else None,
    )


def test_percentile_interpolates_linearly() -> None:
    assert percentile([0.0, 10.0], 50) == 5.0
    assert percentile([0.0, 10.0, 20.0, 30.0, 40.0], 99) == pytest.approx(39.6)
    assert percentile([], 50) == 0.0


def test_queue_jct_utilization_and_groups_are_computed_by_hand() -> None:
    records = [
        record("1", 0, 0, 100, tenant="a", gpus=8),
        record("2", 10, 100, 150, tenant="b", gpus=16, priority="production"),
        record("3", 20, None, None, tenant="b"),  # never started
    ]
    metrics = compute_metrics(
        records,
        capacity_gpus=16,
        allocated_gpu_s=8 * 100 + 16 * 50,
        preemptions=1,
        lost_gpu_s=5.0,
        invariant_violations=0,
        wall_s=0.5,
    )
    assert metrics["jobs"] == 3
    assert metrics["completed"] == 2
    assert metrics["avg_queue_s"] == 45.0  # (0 + 90) / 2: only started jobs
    assert metrics["p50_queue_s"] == 45.0
    assert metrics["max_queue_s"] == 90.0
    assert metrics["avg_jct_s"] == 120.0  # (100 + 140) / 2
    assert metrics["avg_queue_gt8_s"] == 90.0
    assert metrics["makespan_s"] == 150.0  # first submit 0 to last completion 150
    assert metrics["gpu_utilization"] == pytest.approx(1600 / (16 * 150))
    assert metrics["per_tenant"]["b"]["jobs"] == 2
    assert metrics["per_tenant"]["b"]["avg_queue_s"] == 90.0
    assert metrics["per_priority"]["production"]["avg_jct_s"] == 140.0
