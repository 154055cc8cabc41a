"""What users see of shared GPUs: GET /v1/nodes shows each GPU's geometry and who runs in each
slice or share (a team only its own jobs), and queue, node and cluster totals count a slice or
share exactly (a 1g slice of an H100 1/7 of a GPU, a quarter share 1/4)."""

from __future__ import annotations

from fractions import Fraction

from schemas.base import Event
from schemas.jobs import GangReserved, GpuShare, JobAdmitted, MigSlice, RankPlacement
from schemas.nodes import GpuGeometryChanged, MigInstanceSpec
from schemas.teams import QueueConfigured, TeamCreated
from services.api.auth import Principal
from services.api.projections.cluster import summarize
from services.api.projections.model import ReadModels
from services.api.routers.teams import team_view
from services.api.views import node_view, queue_view
from tests.api.builders import Log, node, submitted


def sliced_and_shared() -> ReadModels:
    models = ReadModels()
    geometry = [MigInstanceSpec(profile="1g.10gb", start=s) for s in range(7)]
    events: list[Event] = [
        node("n1", gpus=2),
        GpuGeometryChanged(
            node_id="n1", gpu_index=0, geometry=geometry, reconfigure_s=60, reason="slices"
        ),
    ]
    for n, team in enumerate(("serve", "chat")):
        job = f"slice-{n}"
        events += [
            submitted(job, team, tasks=1, gpus_per_task=0, mig_profile="1g.10gb"),
            JobAdmitted(job_id=job, queue=team, priority="research"),
            GangReserved(
                job_id=job,
                attempt=1,
                ranks=[
                    RankPlacement(
                        rank=0,
                        node_id="n1",
                        gpus=[0],
                        mig=MigSlice(profile="1g.10gb", start=n),
                    )
                ],
            ),
        ]
    events += [
        QueueConfigured(name="lab", guaranteed_gpus=1),
        submitted("nb", "lab", tasks=2, gpus_per_task=0, gpu_fraction=0.25),
        JobAdmitted(job_id="nb", queue="lab", priority="research"),
        GangReserved(
            job_id="nb",
            attempt=1,
            ranks=[
                RankPlacement(
                    rank=rank,
                    node_id="n1",
                    gpus=[1],
                    share=GpuShare(thousandths=250, memory_mb=20_000, sharing="mps"),
                )
                for rank in range(2)
            ],
        ),
    ]
    models.apply_all(Log().record(*events))
    return models


def test_a_node_shows_each_gpus_slices_and_shares() -> None:
    models = sliced_and_shared()
    view = node_view(models.nodes["n1"], models, Principal(team=None))
    mig, shared = view.gpu_details
    assert mig.mode == "mig"
    assert [(s.start, s.free, s.job) for s in mig.geometry][:3] == [
        (0, False, "slice-0"),
        (1, False, "slice-1"),
        (2, True, None),
    ]
    assert mig.reconfiguring_until is not None
    assert shared.mode == "shared" and shared.shared_thousandths == 500
    assert [(s.job, s.memory_mb, s.sharing) for s in shared.shares] == [
        ("nb", 20_000, "mps"),
        ("nb", 20_000, "mps"),
    ]
    # Exact: two sevenths and two quarters, shown to 4 decimals.
    assert view.allocated_gpus == round(float(Fraction(2, 7) + Fraction(1, 2)), 4)
    assert view.free_gpus == 0, "a GPU in MIG mode or soft-shared is no free whole GPU"


def test_a_team_sees_only_its_own_jobs_in_a_shared_gpu() -> None:
    models = sliced_and_shared()
    view = node_view(models.nodes["n1"], models, Principal(team="serve"))
    jobs = [s.job for s in view.gpu_details[0].geometry if not s.free]
    assert jobs == ["slice-0", None]


def test_queues_and_the_cluster_count_slices_and_shares_exactly() -> None:
    models = sliced_and_shared()
    assert models.allocated_by_queue["serve"] == Fraction(1, 7)
    assert models.allocated_by_queue["lab"] == Fraction(1, 2)
    assert queue_view(models.queues["lab"], models).allocated_gpus == 0.5
    assert summarize(models).allocated_gpus == round(float(Fraction(2, 7) + Fraction(1, 2)), 4)


def test_a_team_holding_shares_is_shown_with_its_exact_gpus() -> None:
    # GET /v1/teams and GET /v1/teams/{team} answered 500 for a team holding a share: the
    # team view's GPU counts were integers while a queue's hold exact fractions.
    models = sliced_and_shared()
    models.apply_all(
        Log().record(TeamCreated(name="lab", guaranteed_gpus=0, token_sha256="0" * 64))
    )
    view = team_view(models.teams["lab"], models)
    assert view.allocated_gpus == 0.5
    assert view.borrowed_gpus == 0, "within the queue's guarantee of one GPU"
