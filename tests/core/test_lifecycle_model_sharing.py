"""The job lifecycle state machine (tests/core/test_lifecycle_model.py) on GPUs that are also
cut into MIG slices and soft-shared: besides whole gangs of every class, users submit slice and
share jobs of every class, so whole gangs evict slices and shares to get GPUs back
(core/sharing_reclaim.py), slices and shares evict small gangs and each other
(core/share_preemption.py), and MIG GPUs are re-cut both ways. Every invariant of the machine
holds, with these on top after every step:

- no GPU is bound twice: a running whole-GPU rank has its GPU alone (no slice or share of
  another attempt on it), a MIG instance hosts one attempt's rank, and the live sharing ledger
  finds no problem (a valid geometry, one team per soft-shared GPU, nothing whole and shared);
- quotas add up exactly: every queue's allocation and the state's allocated count are the sum
  of what the holding gangs hold, slices and shares in exact fractions.
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import initialize, invariant, rule

from core import SchedulingPolicy
from schemas.jobs import GangReserved, RankPlacement, TaskExited, TaskStarted
from schemas.nodes import NodeLost
from tests.core.builders import History, a_job
from tests.core.test_lifecycle_model import PRIORITIES, Lifecycle
from tests.core.test_live_sharing_properties import check

# Two nodes of 8 H100s whose geometry the scheduler sets (as the base machine's 2x8:2:1); a
# re-cut of 2 s, so that geometries are re-cut both ways within a run (hold: 20 s).
CLUSTER = (
    "groups:\n"
    "  - {count: 2, gpus: 8, gpu_type: H100, mig: dynamic, reconfigure_s: 2, rack_size: 2}\n"
)
LOW = ("research", "best-effort")


class SharedLifecycle(Lifecycle):
    def __init__(self) -> None:
        super().__init__()
        self.history = History(
            CLUSTER,
            SchedulingPolicy(preemption_grace_s=30, hysteresis_s=60, launch_timeout_s=120),
        )
        self.history.team("alpha", guaranteed=8).team("beta", guaranteed=4)

    @initialize(
        jobs=st.lists(
            st.tuples(
                st.sampled_from(["1g.10gb", "2g.20gb", None]),
                st.integers(1, 3),
                st.sampled_from(["alpha", "beta"]),
                st.sampled_from(LOW),
            ),
            min_size=2,
            max_size=8,
        )
    )
    def low_class_slices_and_shares(self, jobs: list[tuple[str | None, int, str, str]]) -> None:
        for profile, tasks, team, priority in jobs:
            self.submit_slice_or_share(profile, 0.25, tasks, team, priority)
        self.history.run(2, every_s=30.0)
        self.follow()

    @rule(
        profile=st.sampled_from(["1g.10gb", "2g.20gb", "3g.40gb", None]),
        fraction=st.sampled_from([0.25, 0.5]),
        tasks=st.integers(1, 4),
        team=st.sampled_from(["alpha", "beta"]),
        priority=st.sampled_from(PRIORITIES),
    )
    def submit_slice_or_share(
        self, profile: str | None, fraction: float, tasks: int, team: str, priority: str
    ) -> None:
        job = a_job().tasks(tasks).team(team).priority(priority).estimate(300.0).retries(2)
        if profile is not None:
            job = job._set(mig_profile=profile, gpus_per_task=0)
        else:
            job = job._set(gpu_fraction=fraction, gpus_per_task=0)
        self.jobs += self.history.submit(job)

    @invariant()
    def no_gpu_hosts_ranks_of_two_attempts(self) -> None:
        """Folded from the log: ranks started and not exited (nor lost with their node). A
        whole-GPU rank's GPU hosts no other attempt at all; a MIG instance hosts one rank."""
        placed: dict[tuple[str, int, int], RankPlacement] = {}
        running: dict[tuple[str, int, int], str] = {}
        for event, _ in self.history.log:
            if isinstance(event, GangReserved):
                for rank in event.ranks:
                    placed[(event.job_id, event.attempt, rank.rank)] = rank
            elif isinstance(event, TaskStarted):
                running[(event.job_id, event.attempt, event.rank)] = event.node_id
            elif isinstance(event, TaskExited):
                running.pop((event.job_id, event.attempt, event.rank), None)
            elif isinstance(event, NodeLost):
                running = {k: n for k, n in running.items() if n != event.node_id}
        whole: dict[tuple[str, int], tuple[str, int]] = {}
        parts: dict[tuple[str, int], set[tuple[str, int]]] = {}
        instances: dict[tuple[str, int, int], tuple[str, int]] = {}
        for key in running:
            rank = placed[key]
            attempt = key[:2]
            for gpu in rank.gpus:
                where = (rank.node_id, gpu)
                if rank.mig is not None:
                    slot = (rank.node_id, gpu, rank.mig.start)
                    other = instances.setdefault(slot, attempt)
                    assert other == attempt, f"instance {slot} runs {other} and {attempt}"
                if rank.mig is not None or rank.share is not None:
                    parts.setdefault(where, set()).add(attempt)
                else:
                    other = whole.setdefault(where, attempt)
                    assert other == attempt, f"GPU {where} runs {other} and {attempt}"
        for where, attempt in whole.items():
            sharing = parts.get(where, set()) - {attempt}
            assert not sharing, f"GPU {where} runs {attempt} whole and {sharing} in parts"

    @invariant()
    def the_ledger_holds_and_quotas_add_up_exactly(self) -> None:
        check(self.history)


# Fewer examples than the base machine: each step of this one also plans slices and shares.
_PROFILE_EXAMPLES = settings.default.max_examples if settings.default is not None else 40
SharedLifecycle.TestCase.settings = settings(
    max_examples=min(40, _PROFILE_EXAMPLES),
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_the_job_lifecycle_with_slices_and_shares_keeps_its_invariants = SharedLifecycle.TestCase
