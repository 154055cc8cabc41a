"""NVLink: a tensor-parallel group that spans GPUs goes only to a node whose GPUs NVLink joins.

A PCIe box (L40S, PCIe H100) registers `nvlink: false` (NVML's peer-to-peer NVLink status, or
the cluster spec); its GPUs still serve every job that asks no `tp_size` over several GPUs.
"""

from __future__ import annotations

from core.audit import Auditor
from core.policy import SchedulingPolicy
from core.topology import parse_cluster_spec
from schemas.jobs import (
    GangReserved,
    JobAdmitted,
    JobSubmitted,
    PreemptionRequested,
    RankPlacement,
)
from tests.core.builders import History, a_job

# Two nodes whose GPUs NVLink joins, two PCIe boxes of the same GPU type, in one rack name.
MIXED = """
groups:
  - {count: 2, gpus: 8, gpu_type: H100, rack: r0, block: b0}
  - {count: 2, gpus: 8, gpu_type: H100, rack: r0, block: b0, nvlink: false}
"""
JOINED = {"n0000", "n0001"}
PCIE = {"n0002", "n0003"}
PCIE_ONLY = """
groups:
  - {count: 2, gpus: 8, gpu_type: H100, nvlink: false}
"""


def test_a_cluster_spec_group_may_say_its_gpus_talk_over_pcie() -> None:
    nodes = parse_cluster_spec(MIXED)

    assert {node.node_id: node.nvlink for node in nodes} == {
        "n0000": True,
        "n0001": True,
        "n0002": False,
        "n0003": False,
    }


def test_tensor_parallel_gangs_go_only_to_nodes_whose_gpus_nvlink_joins() -> None:
    history = History(MIXED)
    jobs = history.submit(*[a_job().gpus(8).tp(8) for _ in range(4)])

    history.run()

    placed = [job for job in jobs if history.job(job).state == "running"]
    assert len(placed) == 2
    assert set().union(*(history.job(job).placement for job in placed)) == JOINED
    waiting = [history.job(job) for job in jobs if job not in placed]
    assert all(view.placement == {} for view in waiting)
    assert {node.node_id for node in history.state.nodes() if node.free_gpus == 8} == PCIE


def test_a_tp_group_inside_one_task_needs_nvlink_too_and_one_gpu_groups_do_not() -> None:
    history = History(PCIE_ONLY)
    within_task, single = history.submit(a_job().gpus(4).tp(2), a_job().gpus(4).tp(1))

    history.run()

    assert history.job(within_task).placement == {}
    assert history.job(single).state == "running"


def test_work_without_tensor_parallel_groups_takes_the_pcie_boxes_as_well() -> None:
    history = History(MIXED)
    jobs = history.submit(*[a_job().gpus(8) for _ in range(4)])

    history.run()

    assert all(history.job(job).state == "running" for job in jobs)
    used = set().union(*(history.job(job).placement for job in jobs))
    assert used == JOINED | PCIE


def test_a_multi_node_tp_gang_never_mixes_in_a_pcie_box() -> None:
    # 16 GPUs in two tp groups of 8: only the two NVLink nodes together can hold it; with one
    # of them taken it waits, though two PCIe boxes in the same rack are free.
    history = History(MIXED)
    history.occupy("n0000", 8)
    gang = history.submit(a_job().gpus(8).tasks(2).tp(8))[0]

    history.run()

    assert history.job(gang).placement == {}
    assert history.state.free_gpus == 24


def test_a_tp_job_waiting_when_the_first_pcie_box_joins_does_not_take_it() -> None:
    # Shapes ask for NVLink only once the cluster has a node without it (`Shape.nvlink`): the
    # jobs already known are shaped anew when the first such node registers.
    history = History("1x8")
    history.occupy("n0000", 8)
    tp, plain = history.submit(a_job().gpus(8).tp(8), a_job().gpus(8))
    history.run()
    [box] = parse_cluster_spec("groups:\n  - {count: 1, gpus: 8, nvlink: false}\n")
    history.record(box.model_copy(update={"node_id": "pcie-0", "hostname": "pcie-0"}))

    history.run()

    assert history.job(tp).placement == {}
    assert list(history.job(plain).placement) == ["pcie-0"]


def test_on_a_cluster_of_pcie_boxes_a_tp_job_is_told_it_can_never_run_there() -> None:
    history = History(PCIE_ONLY)
    job = history.submit(a_job().gpus(8).tp(8))[0]

    history.run()

    view = history.job(job)
    assert view.reason_code == "unsatisfiable"
    assert "no schedulable node joins its GPUs by NVLink" in (view.reason or "")


def test_a_tp_group_larger_than_every_nvlink_node_names_nvlink_in_its_reason() -> None:
    history = History(
        "groups:\n"
        "  - {count: 1, gpus: 4, gpu_type: H100}\n"
        "  - {count: 1, gpus: 8, gpu_type: H100, nvlink: false}\n"
    )
    job = history.submit(a_job().gpus(8).tp(8))[0]

    history.run()

    view = history.job(job)
    assert view.reason_code == "unsatisfiable"
    assert "no schedulable node has 8 healthy GPUs joined by NVLink (largest has 4)" in (
        view.reason or ""
    )


def test_a_tp_preemptor_evicts_nothing_on_pcie_boxes() -> None:
    # Every GPU is held by best-effort work; a production tp8 job reclaims one NVLink node's
    # worth, and only gangs there are of any use to it.
    history = History(MIXED)
    fillers = history.submit(*[a_job().gpus(8).priority("best-effort") for _ in range(4)])
    history.run()
    assert all(history.job(job).state == "running" for job in fillers)
    history.advance(600)
    history.submit(a_job().gpus(8).tp(8).priority("production"))

    history.run()

    evicted = {event.job_id for event in history.events(PreemptionRequested)}
    assert evicted
    assert all(set(history.job(job).placement) <= JOINED for job in evicted)


def test_the_auditor_flags_a_tp_group_placed_on_a_pcie_box() -> None:
    auditor = Auditor(SchedulingPolicy())
    log = [
        *parse_cluster_spec(PCIE_ONLY),
        JobSubmitted(job_id="j1", spec=a_job().gpus(8).tp(8).spec(), submitted_by="t"),
        JobAdmitted(job_id="j1", queue="team-a", priority="research"),
        GangReserved(
            job_id="j1",
            attempt=1,
            ranks=[RankPlacement(rank=0, node_id="n0000", gpus=list(range(8)))],
        ),
    ]
    for position, event in enumerate(log):
        auditor.observe(event, position, 1_700_000_000.0, None)

    broken = [v for v in auditor.violations if v.rule == "topology"]
    assert [str(v.message) for v in broken] == [
        "job j1's tensor-parallel groups of 8 GPUs were placed on n0000, "
        "whose GPUs NVLink does not join"
    ]


def test_the_auditor_does_not_count_idle_pcie_boxes_as_room_for_a_tp_preemptor() -> None:
    # The NVLink nodes are held by best-effort work, the PCIe boxes idle: the production tp8
    # job may only evict (they are of no use to it), and that is no idle-capacity violation.
    history = History(MIXED)
    history.advance(600)
    for node in sorted(JOINED):
        history.occupy(node, 8, a_job().priority("best-effort"))
    history.advance(600)
    history.submit(a_job().gpus(8).tp(8).priority("production"))

    history.run()

    assert history.events(PreemptionRequested)
    assert [v.message for v in history.auditor.violations] == []


def test_the_auditor_does_not_count_a_plain_gang_across_nvlink_and_pcie_nodes() -> None:
    # Placement keeps a GPU type's nodes with and without NVLink apart (a gang never mixes
    # them): 8 idle GPUs on an NVLink node and 8 on a PCIe box do not hold a gang of 2 x 8.
    history = History(MIXED)
    history.advance(600)
    history.occupy("n0000", 8, a_job().priority("best-effort"))
    history.occupy("n0002", 8, a_job().priority("best-effort"))
    history.advance(600)
    history.submit(a_job().gpus(8).tasks(2).priority("production"))

    history.run()

    assert history.events(PreemptionRequested)
    assert [v.message for v in history.auditor.violations] == []


def test_a_tp_job_asking_more_cpus_than_any_nvlink_node_has_is_told_it_can_never_run() -> None:
    # The PCIe box has the CPUs, but a tp group never goes there: the job could never run.
    history = History(
        "groups:\n"
        "  - {count: 1, gpus: 8, gpu_type: H100, cpus: 32}\n"
        "  - {count: 1, gpus: 8, gpu_type: H100, cpus: 128, nvlink: false}\n"
    )
    job = history.submit(a_job().gpus(8).tp(8).cpus(64))[0]

    history.run()

    view = history.job(job)
    assert view.reason_code == "unsatisfiable"
    assert "no schedulable node has that many (largest has 32)" in (view.reason or "")


def test_a_plain_gang_larger_than_either_kind_of_node_is_told_they_never_mix() -> None:
    # 16 H100s joined by NVLink and 16 on PCIe: a gang takes GPUs of one kind or the other,
    # so 3 tasks of 8 never run, and the reason says why (the cluster has 32 H100s).
    history = History(MIXED)
    job = history.submit(a_job().gpus(8).tasks(3).gpu_type("H100"))[0]

    history.run()

    view = history.job(job)
    assert view.reason_code == "unsatisfiable"
    assert view.reason is not None and view.reason.endswith(
        "the cluster has only 16 schedulable GPUs of that kind for one gang "
        "(a gang never mixes nodes with and without NVLink)"
    )


def test_plain_work_takes_the_pcie_boxes_first_and_leaves_nvlink_nodes_to_tp_gangs() -> None:
    # Two plain jobs and two tp8 jobs fit the four nodes exactly: the plain ones on the PCIe
    # boxes. Taking the NVLink nodes first left both tp jobs waiting beside idle PCIe boxes.
    history = History(MIXED)
    plain = history.submit(a_job().gpus(8), a_job().gpus(8).gpu_type("H100"))
    tp = history.submit(a_job().gpus(8).tp(8), a_job().gpus(8).tp(8))

    history.run()

    assert set().union(*(history.job(job).placement for job in plain)) == PCIE
    assert set().union(*(history.job(job).placement for job in tp)) == JOINED


def test_a_tp_job_that_finds_no_fairness_victims_does_not_hold_back_a_plain_one() -> None:
    # Team alpha's long job holds the PCIe box, team beta's the NVLink node. alpha's short tp8
    # job can take nothing (only beta's node would serve it); its plain 8-GPU job behind may
    # evict alpha's long job for fairness. The tp job's failure stood for both: the plain one
    # waited as long as the tp one did.
    fair = SchedulingPolicy(fairness_preemption=True, las_thresholds_gpu_s=(3600.0, 36_000.0))
    history = History(
        "groups:\n"
        "  - {count: 1, gpus: 8, gpu_type: H100}\n"
        "  - {count: 1, gpus: 8, gpu_type: H100, nvlink: false}\n",
        policy=fair,
    )
    history.team("alpha", guaranteed=8)
    history.team("beta", guaranteed=8)
    history.occupy("n0000", 8, a_job().team("beta").estimate(86400.0))
    long = history.occupy("n0001", 8, a_job().team("alpha").estimate(86400.0))
    history.advance(1200)
    _, plain = history.submit(a_job().gpus(8).tp(8).team("alpha"), a_job().gpus(8).team("alpha"))

    history.run()

    evictions = history.events(PreemptionRequested)
    assert [(e.job_id, e.preemptor_job_id, e.code) for e in evictions] == [
        (long, plain, "fairness")
    ]
    assert history.auditor.violations == []


def test_a_tp_job_waiting_beside_free_pcie_gpus_says_it_waits_for_nvlink_ones() -> None:
    # Seen live: a tp2 job of 4 GPUs waited "for enough free GPUs in one placement" while a
    # PCIe box of its type stood idle, 8 GPUs free: the reason did not say which GPUs.
    history = History(MIXED)
    history.occupy("n0000", 8)
    history.occupy("n0001", 8)
    head, tp, plain = history.submit(
        a_job().gpus(8).tasks(2).tp(8), a_job().gpus(1).tasks(4).tp(2), a_job().gpus(1).tasks(4)
    )

    history.run()

    assert history.job(head).reason_code == "reserved_head"
    view = history.job(tp)
    assert view.state == "queued" and view.reason_code == "no_capacity"
    assert "free GPUs joined by NVLink" in (view.reason or "")
    assert set(history.job(plain).placement) <= PCIE
