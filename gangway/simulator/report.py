"""The rich tables printed at the end of a run."""

from __future__ import annotations

from typing import Any

from rich.table import Table


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.2f} h"


def headline_table(metrics: dict[str, Any], title: str) -> Table:
    table = Table(title=title, show_header=True, header_style="bold")
    table.add_column("figure")
    table.add_column("value", justify="right")
    rows = [
        ("jobs", f"{metrics['jobs']:,}"),
        ("completed", f"{metrics['completed']:,}"),
        ("rejected by admission", f"{metrics.get('rejected', 0):,}"),
        ("average queue time", _duration(metrics["avg_queue_s"])),
        ("p50 queue time", _duration(metrics["p50_queue_s"])),
        ("p99 queue time", _duration(metrics["p99_queue_s"])),
        ("max queue time", _duration(metrics["max_queue_s"])),
        ("average queue time, > 8 GPUs", _duration(metrics["avg_queue_gt8_s"])),
        ("average JCT", _duration(metrics["avg_jct_s"])),
        ("GPU utilization", f"{metrics['gpu_utilization']:.1%}"),
        ("makespan", _duration(metrics["makespan_s"])),
        ("preemptions", f"{metrics['preemptions']:,}"),
        ("lost GPU-hours, preemption", f"{metrics['lost_gpu_s'] / 3600:,.1f}"),
        ("lost GPU-hours, failures", f"{metrics.get('lost_gpu_s_failures', 0.0) / 3600:,.1f}"),
        ("invariant violations", f"{metrics['invariant_violations']:,}"),
        ("wall time", f"{metrics['wall_s']:.1f} s"),
    ]
    for name, value in rows:
        table.add_row(name, value)
    return table


def group_table(groups: dict[str, dict[str, Any]], label: str) -> Table:
    table = Table(title=f"per {label}", show_header=True, header_style="bold")
    for column in (label, "jobs", "completed", "avg queue", "p50 queue", "p99 queue", "avg JCT"):
        table.add_column(column, justify="left" if column == label else "right")
    for name, figures in groups.items():
        table.add_row(
            name,
            f"{figures['jobs']:,}",
            f"{figures['completed']:,}",
            _duration(figures["avg_queue_s"]),
            _duration(figures["p50_queue_s"]),
            _duration(figures["p99_queue_s"]),
            _duration(figures["avg_jct_s"]),
        )
    return table
