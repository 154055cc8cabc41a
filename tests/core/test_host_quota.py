"""CPU and memory ceilings of the queue tree (core/host_quota.py): `max_cpus` and
`max_memory_mb` cap what a queue's subtree holds at once of the hosts, as `max_gpus` caps its
GPUs; a gang past one waits with a reason naming the resource; admission refuses a gang that
could never fit under one."""

from __future__ import annotations

from core.admission import AdmissionCatalog, admit
from core.policy import SchedulingPolicy
from core.topology import parse_cluster_spec
from schemas.jobs import GangReserved, JobAdmitted, JobRejected, JobSpec, PreemptionRequested
from schemas.teams import QueueConfigured, TeamCreated
from tests.core.builders import History, a_job

# Four 8-GPU nodes, each with 32 CPUs and 256 GB: 128 CPUs in all.
CLUSTER = """
rack_size: 2
groups:
  - {count: 4, gpus: 8, cpus: 32, memory_mb: 262144}
"""


def capped(
    history: History,
    name: str,
    *,
    max_cpus: int | None = None,
    max_memory_mb: int | None = None,
    parent: str | None = None,
) -> History:
    history.record(
        QueueConfigured(
            name=name,
            parent=parent,
            guaranteed_gpus=0,
            max_cpus=max_cpus,
            max_memory_mb=max_memory_mb,
        )
    )
    return history


def reason(history: History, job_id: str) -> tuple[str, str]:
    deferrals = history.deferrals(job_id)
    assert deferrals, f"{job_id} recorded no reason"
    return deferrals[-1].code, deferrals[-1].message


def tasks_placed(history: History, job_id: str) -> int:
    return len(history.events(GangReserved, job_id)[-1].ranks)


def test_a_queue_holds_no_more_cpus_than_its_ceiling_and_the_next_gang_says_why() -> None:
    history = capped(History(CLUSTER), "team-a", max_cpus=16)
    first = history.submit(a_job().cpu_only(4).tasks(3))[0]  # 12 CPUs
    second = history.submit(a_job().cpu_only(4).tasks(2))[0]  # 8 more: 20 > 16
    other = history.submit(a_job().team("team-b").cpu_only(4).tasks(8))[0]

    history.run()

    assert history.job(first).state == "running"
    assert history.job(other).state == "running"  # the cluster has room; only team-a is capped
    assert history.job(second).state == "queued"
    assert reason(history, second) == (
        "quota_ceiling_cpus",
        "needs 2 tasks of 4 CPUs, no GPU; queue team-a would exceed its ceiling of 16 CPUs",
    )


def test_the_ceiling_counts_gpu_gangs_cpus_too_and_frees_as_they_end() -> None:
    history = capped(History(CLUSTER), "team-a", max_cpus=16)
    train = history.submit(a_job().gpus(1).tasks(2).cpus(6))[0]  # 12 CPUs beside 2 GPUs
    prep = history.submit(a_job().cpu_only(8))[0]
    history.run()
    assert history.job(train).state == "running"
    assert reason(history, prep)[0] == "quota_ceiling_cpus"

    history.exit(train)
    history.run(2)

    assert history.job(prep).state == "running"


def test_a_parents_memory_ceiling_caps_its_children_together() -> None:
    history = capped(History(CLUSTER), "org", max_memory_mb=100_000)
    capped(history, "team-a", parent="org")
    capped(history, "team-b", parent="org")
    a = history.submit(a_job().cpu_only(1).memory(60_000))[0]
    history.run()
    b = history.submit(a_job().team("team-b").cpu_only(1).memory(60_000))[0]
    history.run()

    assert history.job(a).state == "running"
    assert history.job(b).state == "queued"
    code, why = reason(history, b)
    assert code == "quota_ceiling_memory"
    assert why.endswith("queue org would exceed its ceiling of 100000 MB of memory")


def test_an_elastic_gang_takes_only_the_tasks_its_ceiling_leaves_room_for() -> None:
    history = capped(History(CLUSTER), "team-a", max_cpus=20)
    gang = history.submit(a_job().cpu_only(4).tasks(8).min_tasks(2))[0]

    history.run()

    assert history.job(gang).state == "running"
    assert tasks_placed(history, gang) == 5  # 5 x 4 = 20 CPUs


def test_a_queue_at_its_cpu_ceiling_preempts_nobody() -> None:
    """A ceiling is no guarantee: waiting on one's own ceiling takes nothing from others."""
    history = capped(History(CLUSTER), "team-a", max_cpus=8)
    history.submit(a_job().team("team-b").priority("research").cpu_only(32).tasks(3))
    history.run()
    history.submit(a_job().priority("production").cpu_only(8))
    first = history.submit(a_job().priority("production").cpu_only(8))[0]

    history.run(3)

    assert not history.events(PreemptionRequested)
    assert reason(history, first)[0] == "quota_ceiling_cpus"


def test_ceilings_are_not_enforced_where_quotas_are_off() -> None:
    history = capped(History(CLUSTER, policy=SchedulingPolicy(name="fifo")), "team-a", max_cpus=4)
    job = history.submit(a_job().cpu_only(8))[0]

    history.run()

    assert history.job(job).state == "running"


def test_the_ceiling_is_refolded_from_the_log() -> None:
    history = capped(History(CLUSTER), "team-a", max_cpus=12, max_memory_mb=2048)
    queue = history.replayed().queue_records["team-a"]

    assert (queue.max_cpus_milli, queue.max_memory_mb) == (12_000, 2048)


def catalog_with(max_cpus: int | None, max_memory_mb: int | None) -> AdmissionCatalog:
    catalog = AdmissionCatalog()
    catalog.apply(TeamCreated(name="ml", guaranteed_gpus=0, token_sha256="0" * 64))
    catalog.apply(
        QueueConfigured(
            name="ml", guaranteed_gpus=0, max_cpus=max_cpus, max_memory_mb=max_memory_mb
        )
    )
    for node in parse_cluster_spec(CLUSTER):
        catalog.apply(node)
    return catalog


CLASSES = ("inference-critical", "production", "research", "best-effort")


def test_admission_refuses_a_gang_whose_least_size_passes_a_ceiling_for_good() -> None:
    catalog = catalog_with(max_cpus=16, max_memory_mb=10_000)
    spec = JobSpec(name="p", team="ml", tasks=5, gpus_per_task=0, cpus_per_task=4, command=["x"])
    fits = spec.model_copy(update={"tasks": 4})
    elastic = spec.model_copy(update={"min_tasks": 4})
    heavy = fits.model_copy(update={"memory_mb_per_task": 4000})

    refused = admit("j1", spec, catalog, CLASSES)
    assert isinstance(refused, JobRejected)
    assert (refused.code, refused.reason) == (
        "over_quota_max",
        "needs 20 CPUs but queue 'ml' may never use more than 16",
    )
    assert isinstance(admit("j2", fits, catalog, CLASSES), JobAdmitted)
    assert isinstance(admit("j3", elastic, catalog, CLASSES), JobAdmitted)
    memory = admit("j4", heavy, catalog, CLASSES)
    assert isinstance(memory, JobRejected) and memory.code == "over_quota_max"
    assert "16000 MB of memory" in memory.reason
