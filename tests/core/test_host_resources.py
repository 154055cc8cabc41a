"""CPUs and memory as resources (DESIGN §8): nodes declare them, tasks ask them, placement
respects them for whole-GPU gangs as for CPU-only tasks, and `why` names the one that blocks."""

from __future__ import annotations

import pytest

from core.admission import NodeShape
from core.host import host_rejection
from core.ordering import fair_share
from schemas.jobs import GangReserved, JobDeferred, JobSpec
from tests.core.builders import History, a_job

# Two racks of two 8-GPU nodes, each with 32 CPUs and 256 GB.
CLUSTER = """
rack_size: 2
groups:
  - {count: 4, gpus: 8, cpus: 32, memory_mb: 262144}
"""


def host_of(history: History, node_id: str) -> tuple[int, int]:
    """(thousandths of a CPU, MB) bound on the node, as the state folded them."""
    node = history.state.node_record(node_id)
    assert node is not None
    return node.cpus_bound_milli, node.memory_bound_mb


def last_reason(history: History, job_id: str) -> JobDeferred:
    deferrals = history.deferrals(job_id)
    assert deferrals, f"job {job_id} recorded no reason"
    return deferrals[-1]


def test_a_node_with_free_gpus_but_no_free_cpus_cannot_take_the_rank() -> None:
    history = History(CLUSTER)
    hog = history.submit(a_job().gpus(1).cpus(32))[0]
    history.run()
    (hog_node,) = history.job(hog).placement

    neighbour = history.submit(a_job().gpus(1).cpus(4))[0]
    history.run()

    assert history.job(neighbour).state == "running"
    assert hog_node not in history.job(neighbour).placement  # 7 GPUs free there, no CPU
    assert host_of(history, hog_node) == (32_000, 0)


def test_without_cpu_asks_the_same_node_takes_the_rank_best_fit() -> None:
    history = History(CLUSTER)
    first = history.submit(a_job().gpus(1))[0]
    history.run()
    second = history.submit(a_job().gpus(1))[0]
    history.run()

    assert history.job(first).placement.keys() == history.job(second).placement.keys()


def test_a_gang_spreads_over_as_many_nodes_as_its_cpus_need() -> None:
    """Four tasks of 2 GPUs and 16 CPUs: the GPUs would fit one node, the CPUs need two."""
    history = History(CLUSTER)
    gang = history.submit(a_job().gpus(2).tasks(4).cpus(16))[0]

    history.run()

    placement = history.job(gang).placement
    assert history.job(gang).state == "running"
    assert sorted(len(gpus) for gpus in placement.values()) == [4, 4]
    for node_id in placement:
        assert host_of(history, node_id) == (32_000, 0)


def test_memory_bounds_the_tasks_of_a_node_as_cpus_do() -> None:
    history = History(CLUSTER)
    gang = history.submit(a_job().gpus(1).tasks(3).memory(100_000))[0]

    history.run()

    placement = history.job(gang).placement
    assert sorted(len(gpus) for gpus in placement.values()) == [1, 2]


def test_why_names_the_cpus_that_block_and_the_most_free_beside_free_gpus() -> None:
    history = History(CLUSTER)
    for _ in range(4):
        history.submit(a_job().gpus(1).cpus(24).estimate(3600))
    history.run()  # every node: 7 GPUs and 8 CPUs free
    big = history.submit(a_job().gpus(1).cpus(16).priority("best-effort"))[0]

    history.run()

    reason = last_reason(history, big)
    assert reason.code == "insufficient_cpus"
    assert reason.message == (
        "needs 1 GPU, 16 CPUs per task; "
        "needs 16 CPUs per task; the most free on any node with free GPUs is 8"
    )


def test_why_names_memory_when_memory_blocks() -> None:
    history = History(CLUSTER)
    for _ in range(4):
        history.submit(a_job().gpus(1).memory(200_000).estimate(3600))
    history.run()
    big = history.submit(a_job().gpus(1).memory(100_000).priority("best-effort"))[0]

    history.run()

    reason = last_reason(history, big)
    assert reason.code == "insufficient_memory"
    assert reason.message.endswith(
        "needs 100000 MB of memory per task; the most free on any node with free GPUs is 62144 MB"
    )


def test_a_task_asking_more_cpus_than_any_node_has_is_unsatisfiable() -> None:
    history = History(CLUSTER)
    job = history.submit(a_job().gpus(1).cpus(64))[0]

    history.run()

    reason = last_reason(history, job)
    assert reason.code == "unsatisfiable"
    assert "no schedulable node has that many (largest has 32)" in reason.message


def test_a_cpu_only_task_runs_on_cpus_alone_and_holds_no_gpu() -> None:
    history = History(CLUSTER)
    prep = history.submit(a_job().cpu_only(8).memory(16_000).tasks(2))[0]

    history.run()

    view = history.job(prep)
    assert view.state == "running"
    (gang,) = history.events(GangReserved, prep)
    assert [rank.gpus for rank in gang.ranks] == [[], []]
    assert history.state.allocated_gpus == 0
    assert history.state.free_gpus == 32
    (node_id,) = {rank.node_id for rank in gang.ranks}  # both fit one node: best fit
    assert host_of(history, node_id) == (16_000, 32_000)

    history.exit(prep)
    history.run()

    assert history.job(prep).state == "succeeded"
    assert host_of(history, node_id) == (0, 0)
    assert history.auditor.violations == []


def test_a_cpu_only_task_goes_where_the_gpus_are_taken() -> None:
    """The CPUs beside free GPUs are those GPU gangs will need: a CPU-only task takes the CPUs
    of a node whose GPUs are all busy first."""
    history = History(CLUSTER)
    full = history.occupy("n0002", 8)
    prep = history.submit(a_job().cpu_only(4))[0]

    history.run()

    assert history.job(full).state == "running"
    assert list(history.job(prep).placement) == ["n0002"]


def test_a_cpu_only_task_waits_for_cpus_and_says_so_then_runs() -> None:
    history = History(CLUSTER)
    fillers = history.submit(*[a_job().cpu_only(32).estimate(600) for _ in range(4)])
    history.run()
    late = history.submit(a_job().cpu_only(8))[0]

    history.run()

    assert history.job(late).state == "queued"
    reason = last_reason(history, late)
    assert reason.code in ("insufficient_cpus", "reserved_head")
    waits = [d for d in history.deferrals(late) if d.code == "insufficient_cpus"] or [reason]
    assert "needs 1 task of 8 CPUs, no GPU" in waits[-1].message

    history.exit(fillers[0])
    history.run(2)

    assert history.job(late).state == "running"
    assert history.auditor.violations == []


def test_a_waiting_cpu_only_task_that_is_not_the_head_names_its_cpus() -> None:
    history = History(CLUSTER)
    history.submit(*[a_job().cpu_only(32).estimate(600) for _ in range(4)])
    history.run()
    head, behind = history.submit(a_job().cpu_only(32), a_job().cpu_only(8).priority("best-effort"))

    history.run()

    assert last_reason(history, head).code == "reserved_head"
    reason = last_reason(history, behind)
    assert reason.code == "insufficient_cpus"
    assert reason.message == (
        "needs 1 task of 8 CPUs, no GPU; needs 8 CPUs per task; the most free on any node is 0"
    )


def test_a_cpu_only_gang_under_require_node_stays_on_one_node() -> None:
    history = History(CLUSTER)
    history.submit(a_job().cpu_only(24).estimate(600))
    history.run()
    gang = history.submit(a_job().cpu_only(8).tasks(4).require("node"))[0]

    history.run()

    (gang_event,) = history.events(GangReserved, gang)
    assert len({rank.node_id for rank in gang_event.ranks}) == 1


def test_a_head_waiting_for_cpus_gets_a_reservation_where_they_free_up() -> None:
    history = History(CLUSTER)
    for _ in range(4):
        history.submit(a_job().gpus(1).cpus(24).estimate(600))
    history.run()
    head = history.submit(a_job().gpus(1).cpus(16))[0]

    history.run()

    reason = last_reason(history, head)
    assert reason.code == "reserved_head"
    assert history.job(head).estimated_start is not None


def test_the_cycle_frees_the_cpus_of_gangs_it_releases_for_the_jobs_it_places() -> None:
    history = History("groups:\n  - {count: 1, gpus: 8, cpus: 16}")
    done = history.submit(a_job().gpus(1).cpus(16))[0]
    history.run()
    waiting = history.submit(a_job().gpus(1).cpus(16))[0]
    history.run()
    assert history.job(waiting).state == "queued"

    history.exit(done)
    history.run()

    assert history.job(waiting).state == "running"


def test_a_replayed_state_binds_the_same_cpus_and_memory() -> None:
    history = History(CLUSTER)
    history.submit(a_job().gpus(2).tasks(3).cpus(12).memory(50_000), a_job().cpu_only(3.5))
    history.run(2)

    replayed = history.replayed()

    for node in history.state.node_records:
        again = replayed.node_record(node.node_id)
        assert again is not None
        assert (again.cpus_bound_milli, again.memory_bound_mb) == (
            node.cpus_bound_milli,
            node.memory_bound_mb,
        )


def test_a_fleet_that_declares_no_cpus_does_not_limit_gpu_gangs() -> None:
    history = History("2x8")
    gang = history.submit(a_job().gpus(1).tasks(8).cpus(512))[0]

    history.run()

    assert history.job(gang).state == "running"


def test_a_cpu_only_gang_spreads_over_nodes_that_declare_no_cpus() -> None:
    """Nothing else bounds a CPU-only rank there: such a node counts 8 CPUs per GPU, so 128
    ranks of one CPU fill two 8-GPU nodes (64 each) instead of piling onto the first."""
    history = History("4x8")
    prep = history.submit(a_job().cpu_only(1).tasks(128))[0]

    history.run()

    assert history.job(prep).state == "running"
    [reserved] = history.events(GangReserved, prep)
    per_node: dict[str, int] = {}
    for rank in reserved.ranks:
        per_node[rank.node_id] = per_node.get(rank.node_id, 0) + 1
    assert sorted(per_node.values()) == [64, 64]


def test_a_cpu_only_gang_larger_than_the_assumed_cpus_is_refused_at_admission() -> None:
    nodes = [NodeShape(f"n{i}", "H100", 8, "r0", "b0") for i in range(2)]
    fits = JobSpec(name="p", team="t", tasks=128, gpus_per_task=0, cpus_per_task=1, command=["x"])
    too_many = fits.model_copy(update={"tasks": 129})

    assert host_rejection(fits, nodes) is None
    rejection = host_rejection(too_many, nodes)
    assert rejection is not None and rejection[0] == "gang_too_large"


def test_fair_share_counts_the_dominant_resource() -> None:
    """Team cpu fills half of the fleet's CPUs with preprocessing and no GPU; team gpu holds
    one of 32 GPUs. By dominant share, cpu used more: gpu's next job goes first."""
    history = History(CLUSTER)
    history.team("cpu", guaranteed=4).team("gpu", guaranteed=4)
    history.submit(*[a_job().team("cpu").cpu_only(16).estimate(3600) for _ in range(4)])
    history.submit(a_job().team("gpu").gpus(1).estimate(3600))
    history.run()
    history.advance(1800)

    queues = history.state.queue_records
    capacity = history.state.host_capacity()
    policy = history.policy
    cpu_share = fair_share(queues["cpu"], history.now, policy, capacity)
    gpu_share = fair_share(queues["gpu"], history.now, policy, capacity)
    assert cpu_share > gpu_share > 0
    # Half the CPUs is worth half the GPUs: 16 GPU-equivalents against 1 GPU.
    assert cpu_share == pytest.approx(16 * gpu_share, rel=1e-6)
    # Without the fleet's capacity (GPUs only), the CPU team would look idle.
    assert fair_share(queues["cpu"], history.now, policy) == 0.0


@pytest.mark.parametrize("guaranteed", [0, 2], ids=["no guarantees", "within guarantees"])
def test_dominant_resource_fair_share_orders_the_next_jobs(guaranteed: int) -> None:
    """Without guarantees, quotas (in GPUs) put neither team first and fair share decides;
    with guarantees both next jobs stay within, jobs of queues with a guarantee are ordered by
    the same dominant share: the team that filled the CPUs goes after."""
    history = History("groups:\n  - {count: 1, gpus: 2, cpus: 8}")
    history.team("cpu", guaranteed=guaranteed).team("gpu", guaranteed=guaranteed)
    history.submit(a_job().team("cpu").cpu_only(6).estimate(3600))
    history.submit(a_job().team("gpu").gpus(1).cpus(1).estimate(3600))
    history.run()
    history.advance(1800)
    # One GPU and 1 CPU are left: whose job gets them is fair share's call.
    cpu_next, gpu_next = history.submit(
        a_job().team("cpu").gpus(1).cpus(1), a_job().team("gpu").gpus(1).cpus(1)
    )

    history.run()

    assert history.job(gpu_next).state == "running"
    assert history.job(cpu_next).state == "queued"


def test_a_gang_short_of_cpus_preempts_the_cpu_only_work_that_holds_them() -> None:
    history = History("groups:\n  - {count: 1, gpus: 8, cpus: 16}")
    prep = history.submit(a_job().cpu_only(16).priority("best-effort"))[0]
    history.run()
    urgent = history.submit(a_job().gpus(1).cpus(8).priority("production"))[0]

    history.run()

    assert history.job(prep).state == "preempting"
    history.evict(prep)
    history.run(2)
    assert history.job(urgent).state == "running"
    assert history.auditor.violations == []


def test_a_gang_that_asks_no_cpus_never_preempts_cpu_only_work() -> None:
    """Evicting a CPU-only gang frees no GPU: a gang of GPUs alone gains nothing by it."""
    history = History("groups:\n  - {count: 1, gpus: 1, cpus: 16}")
    history.submit(a_job().gpus(1).priority("best-effort").estimate(3600))
    prep = history.submit(a_job().cpu_only(16).priority("best-effort"))[0]
    history.run()
    urgent = history.submit(a_job().gpus(1).priority("production"))[0]

    history.run()

    assert history.job(prep).state == "running"
    assert history.job(urgent).state == "queued"
