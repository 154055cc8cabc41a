"""The run's plot: queue-time distributions per priority class and per tenant, and GPUs
allocated over time."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gangway.simulator.metrics import SimJobMetrics

# Queue times are plotted on a log axis; a job that started within a second sits at this floor.
_FLOOR_S = 1.0


def _queue_seconds(records: Sequence[SimJobMetrics], key: str) -> dict[str, list[float]]:
    groups: dict[str, list[float]] = {}
    for record in records:
        queue = record.queue_s
        if queue is not None:
            name = record.tenant if key == "tenant" else record.priority
            groups.setdefault(name, []).append(max(queue, _FLOOR_S))
    return {name: groups[name] for name in sorted(groups)}


def _horizontal(version: str) -> dict[str, Any]:
    # `orientation` replaced `vert` in matplotlib 3.10 (and `vert` now warns).
    major, minor = (int(part) for part in version.split(".")[:2])
    return {"orientation": "horizontal"} if (major, minor) >= (3, 10) else {"vert": False}


def write_plot(
    path: str | Path,
    records: Sequence[SimJobMetrics],
    timeline: Sequence[tuple[float, int | float]],
    *,
    capacity_gpus: int,
    title: str,
) -> None:
    """Write a PNG with three panels; the Agg backend keeps it free of any display."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(3, 1, figsize=(11, 12), gridspec_kw={"height_ratios": [1, 1.3, 1]})
    for axis, key in ((axes[0], "priority"), (axes[1], "tenant")):
        groups = _queue_seconds(records, key)
        if groups:
            axis.boxplot(
                list(groups.values()),
                **_horizontal(matplotlib.__version__),
                whis=(1, 99),
                showfliers=False,
                showmeans=True,
            )
            axis.set_yticks(
                range(1, len(groups) + 1),
                [f"{name} ({len(values)})" for name, values in groups.items()],
            )
        axis.set_xscale("log")
        longest = max((max(values) for values in groups.values()), default=_FLOOR_S)
        # A fixed floor and at least a day of range, so runs can be compared by eye.
        axis.set_xlim(_FLOOR_S / 2, max(longest * 2, 86400.0))
        axis.set_xticks(
            [1, 60, 600, 3600, 6 * 3600, 86400, 7 * 86400],
            ["<=1 s", "1 min", "10 min", "1 h", "6 h", "1 d", "1 w"],
        )
        axis.set_xlabel("queue time (log; box p25-p75, whiskers p1-p99, triangle = mean)")
        axis.set_title(f"queue time per {key}")
        axis.grid(axis="x", alpha=0.3)

    axis = axes[2]
    if timeline:
        origin = timeline[0][0]
        days = [(at - origin) / 86400.0 for at, _ in timeline]
        allocated = [gpus for _, gpus in timeline]
        axis.step(days, allocated, where="post", linewidth=0.6)
    axis.axhline(capacity_gpus, color="grey", linestyle="--", linewidth=0.8, label="capacity")
    axis.set_xlabel("days since the first submission")
    axis.set_ylabel("GPUs allocated")
    axis.set_title("GPUs allocated over time")
    axis.legend(loc="lower right")
    axis.grid(alpha=0.3)

    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
