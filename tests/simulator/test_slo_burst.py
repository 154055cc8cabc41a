"""The simulator scenario of issue 12's SLO classes: bursts of inference-critical replicas on
a cluster full of preemptible training; each is admitted (its gang bound) within one second
of simulated time, from the headroom the policy keeps, and the training it displaces is
evicted after, with its checkpoint grace, and resumes."""

from __future__ import annotations

from pathlib import Path

from core import SchedulingPolicy, parse_cluster_spec
from gangway.simulator.engine import Simulation
from gangway.simulator.trace import read_trace

HEADER = "job_id,submit_time,num_gpus,duration_s,tenant,priority"


def burst_trace(path: Path, *, nodes: int, bursts: int, replicas: int) -> Path:
    """Training fills every node but one (8-GPU gangs, a day long); then every 30 minutes a
    burst of 1-GPU inference replicas of 20 minutes, 0.1 s apart."""
    rows = [f"train{n},0,8,86400,research,research" for n in range(nodes - 1)]
    rows.append("late-train,10,8,86400,research,research")  # would take the last node
    for burst in range(bursts):
        start = 600 + burst * 1800
        for replica in range(replicas):
            at = start + replica / 10
            rows.append(f"infer{burst}-{replica},{at},1,1200,serve,inference-critical")
    path.write_text("\n".join((HEADER, *rows)) + "\n")
    return path


def test_every_inference_replica_of_a_burst_is_admitted_within_one_second(
    tmp_path: Path,
) -> None:
    nodes = parse_cluster_spec("8x8:4:2")
    policy = SchedulingPolicy(inference_headroom_gpus=8, inference_max_victim_gpus=8)
    trace = burst_trace(tmp_path / "trace.csv", nodes=8, bursts=4, replicas=8)
    simulation = Simulation(read_trace(trace), nodes, policy=policy)

    result = simulation.run()

    inference = [r for r in result.records if r.job_id.startswith("infer")]
    assert len(inference) == 32
    waits = [r.queue_s for r in inference]
    assert all(wait is not None and wait <= 1.0 for wait in waits), waits
    late = next(r for r in result.records if r.job_id == "late-train")
    assert late.queue_s is None or late.queue_s > 0  # the headroom was not its to take
    assert result.violations == []


def test_without_headroom_a_burst_waits_for_the_checkpoint_grace(tmp_path: Path) -> None:
    """The same burst with no headroom: the replicas preempt training and start only once it
    has checkpointed and left: the trade-off the headroom buys out."""
    nodes = parse_cluster_spec("8x8:4:2")
    trace = burst_trace(tmp_path / "trace.csv", nodes=8, bursts=1, replicas=8)
    simulation = Simulation(read_trace(trace), nodes, policy=SchedulingPolicy())

    result = simulation.run()

    waits = [r.queue_s for r in result.records if r.job_id.startswith("infer")]
    assert all(wait is not None for wait in waits)
    assert max(w for w in waits if w is not None) > 1.0
