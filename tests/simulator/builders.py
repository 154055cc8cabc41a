"""Small hand-made traces and runs for the simulator tests (real core, no mocks)."""

from __future__ import annotations

from pathlib import Path

from core import SchedulingPolicy, parse_cluster_spec
from gangway.simulator.baselines import Baseline
from gangway.simulator.engine import Simulation, SimulationConfig, SimulationResult
from gangway.simulator.quotas import Quota
from gangway.simulator.trace import read_trace

BY_NAME: dict[str, Baseline | None] = {
    "gangway": None,
    "fifo": "fifo",
    "sjf-oracle": "sjf-oracle",
    "srtf-oracle": "srtf-oracle",
}
HEADER = "job_id,submit_time,num_gpus,duration_s,tenant"


def write_trace(tmp_path: Path, *rows: str, header: str = HEADER) -> Path:
    path = tmp_path / "trace.csv"
    path.write_text("\n".join((header, *rows)) + "\n")
    return path


def simulate(
    trace: Path,
    cluster: str,
    *,
    policy: str = "gangway",
    quotas: dict[str, Quota] | None = None,
    config: SimulationConfig | None = None,
    scheduling: SchedulingPolicy | None = None,
) -> tuple[Simulation, SimulationResult]:
    nodes = parse_cluster_spec(cluster)
    simulation = Simulation(
        read_trace(trace, node_gpus=max(len(node.gpus) for node in nodes)),
        nodes,
        policy=scheduling or SchedulingPolicy(),
        quotas=quotas,
        config=config,
        baseline=BY_NAME[policy],
        keep_log=True,
    )
    return simulation, simulation.run()
