"""The lifecycle model's smaller version, over the real services: every service a process on
the real PostgreSQL and Kafka, and a two-node simulated fleet whose ranks are real processes.

A hypothesis state machine submits, cancels, suspends and resumes jobs through the API and
kills ranks of running gangs; after every step it waits (a bounded while) for the system to
settle, then checks:

- the core's auditor finds no violation in the whole log, and no waiting job lacks a reason
  (what `gangway audit` checks);
- every reserved gang has all its ranks started or its launch deadline still pending;
- no GPU hosts ranks of two attempts, both in the log (TaskStarted/TaskExited) and on the
  machine (the rank processes found in /proc, by the placement in their environment).

Few steps, derandomized: it runs the same examples every time, in about two minutes.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import AsyncIterator, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from core import Auditor, SchedulingPolicy
from schemas.jobs import GANG_RELEASING_EVENTS, GangReserved, TaskExited, TaskStarted
from schemas.nodes import NodeLost
from tests.e2e.system import System, running_system
from tests.integration.conftest import Stack

pytestmark = pytest.mark.e2e

T = TypeVar("T")
CLUSTER = "2x4:2:1"
ENV = {"GANGWAY_STOP_TIMEOUT_S": "3", "GANGWAY_SCHEDULER_RETRY_BACKOFF_BASE_S": "1"}
# How long the system may take to act on a step; the checks run then, settled or not.
SETTLE_S = 30.0
Attempt = tuple[str, int]


@pytest.fixture(scope="module")
async def system(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[System]:
    state_dir: Path = tmp_path_factory.mktemp("lifecycle-e2e")
    async with running_system(
        stack, state_dir, cluster=CLUSTER, scheduler_replicas=1, env=ENV
    ) as running:
        await running.create_team("ml", guaranteed_gpus=4)
        yield running


# ---------------------------------------------------------------------- what the log says


@dataclass
class Folded:
    """The whole log, read once: the auditor's verdict and each attempt's ranks."""

    auditor: Auditor
    gangs: dict[Attempt, GangReserved] = field(default_factory=dict)
    reserved_at: dict[Attempt, float] = field(default_factory=dict)
    started: dict[Attempt, set[int]] = field(default_factory=dict)
    released: set[Attempt] = field(default_factory=set)
    # Ranks started and neither exited nor lost with their node: (job, attempt, rank) → node.
    running: dict[tuple[str, int, int], str] = field(default_factory=dict)
    current: dict[str, int] = field(default_factory=dict)

    def unstarted(self) -> list[Attempt]:
        """Gangs held (not released) with a rank not started yet."""
        return [
            key
            for key, gang in self.gangs.items()
            if key not in self.released and len(self.started.get(key, set())) < len(gang.ranks)
        ]


async def fold(system: System) -> Folded:
    folded = Folded(Auditor(SchedulingPolicy()))
    async for batch in system.store.iter_raw():
        for raw in batch:
            event = system.store.registry.decode(raw.type, raw.schema_version, raw.payload)
            at = raw.recorded_at.timestamp()
            folded.auditor.observe(event, raw.position, at, raw.epoch)
            if isinstance(event, GangReserved):
                key = (event.job_id, event.attempt)
                folded.gangs[key] = event
                folded.reserved_at[key] = at
                folded.current[event.job_id] = event.attempt
            elif isinstance(event, TaskStarted):
                folded.started.setdefault((event.job_id, event.attempt), set()).add(event.rank)
                folded.running[(event.job_id, event.attempt, event.rank)] = event.node_id
            elif isinstance(event, TaskExited):
                folded.running.pop((event.job_id, event.attempt, event.rank), None)
            elif isinstance(event, NodeLost):
                folded.running = {k: n for k, n in folded.running.items() if n != event.node_id}
            elif isinstance(event, GANG_RELEASING_EVENTS):
                attempt = getattr(event, "attempt", None) or folded.current.get(event.job_id)
                if attempt is not None:
                    folded.released.add((event.job_id, attempt))
    return folded


# ---------------------------------------------------------------------- what the machine runs


@dataclass(frozen=True)
class RankProcess:
    pid: int
    job_id: str
    attempt: int
    rank: int
    node_id: str
    gpus: tuple[int, ...]


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in pairs}


def _start_time(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]


def rank_processes(jobs: set[str]) -> list[RankProcess]:
    """The live processes of ranks of `jobs` (a rank's children included), all alive at once:
    each is seen, then confirmed alive (same start time) after the whole scan."""
    seen: dict[int, tuple[str, RankProcess]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        try:
            env = _environ(pid)
            if env.get("GANGWAY_JOB_ID") not in jobs:
                continue
            gpus = tuple(int(g) for g in env["CUDA_VISIBLE_DEVICES"].split(",") if g)
            process = RankProcess(
                pid,
                env["GANGWAY_JOB_ID"],
                int(env["GANGWAY_ATTEMPT"]),
                int(env["GANGWAY_RANK"]),
                env["GANGWAY_NODE_ID"],
                gpus,
            )
            seen[pid] = (_start_time(pid), process)
        except (OSError, KeyError, ValueError, IndexError):
            continue  # gone meanwhile, a zombie, or not a rank
    alive = []
    for pid, (started, process) in seen.items():
        with contextlib.suppress(OSError, IndexError):
            if _start_time(pid) == started and _environ(pid):
                alive.append(process)
    return alive


# ---------------------------------------------------------------------- the machine


class RealLifecycle(RuleBasedStateMachine):
    system: ClassVar[System]
    loop: ClassVar[asyncio.AbstractEventLoop]
    submitted: ClassVar[set[str]] = set()

    def __init__(self) -> None:
        super().__init__()
        self.jobs: list[str] = []

    def wait(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run `coroutine` on the test's event loop (the machine runs in a thread of its own)."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(120)

    def pick(self, index: int) -> str | None:
        return self.jobs[index % len(self.jobs)] if self.jobs else None

    async def _post(self, path: str, body: dict[str, Any] | None = None) -> Any:
        async with self.system.client() as api:
            response = await api.post(path, json=body)
        assert response.status_code in (200, 201, 202, 409), response.text
        return response.json()

    @rule(
        gpus=st.sampled_from([1, 2, 4]),
        tasks=st.integers(1, 2),
        priority=st.sampled_from(["production", "research", "best-effort"]),
        seconds=st.sampled_from([3, 600]),
        stubborn=st.booleans(),
    )
    def submit(self, gpus: int, tasks: int, priority: str, seconds: int, stubborn: bool) -> None:
        # A stubborn rank ignores SIGTERM and lingers until the agent's SIGKILL, seconds later:
        # its GPUs must not go to another attempt meanwhile.
        command = (
            [
                "sh",
                "-c",
                f"trap '' TERM; end=$(($(date +%s) + {seconds})); "
                'while [ "$(date +%s)" -lt "$end" ]; do sleep 0.2; done',
            ]
            if stubborn
            else ["sleep", str(seconds)]
        )
        body = {
            "name": "model",
            "team": "ml",
            "tasks": tasks,
            "gpus_per_task": gpus,
            "priority": priority,
            "command": command,
            "max_retries": 1,
        }
        job = str(self.wait(self._post("/v1/jobs", body))["id"])
        self.jobs.append(job)
        self.submitted.add(job)

    @rule(index=st.integers(0, 20))
    def cancel(self, index: int) -> None:
        job = self.pick(index)
        if job is not None:
            self.wait(self._post(f"/v1/jobs/{job}/cancel"))

    @rule(index=st.integers(0, 20))
    def suspend(self, index: int) -> None:
        job = self.pick(index)
        if job is not None:
            self.wait(self._post(f"/v1/jobs/{job}/suspend"))

    @rule(index=st.integers(0, 20))
    def resume(self, index: int) -> None:
        job = self.pick(index)
        if job is not None:
            self.wait(self._post(f"/v1/jobs/{job}/resume"))

    @rule(index=st.integers(0, 20))
    def fail_rank(self, index: int) -> None:
        """A rank of a running gang dies (SIGKILL from outside: a crash, not the agent's stop)."""
        job = self.pick(index)
        ranks = [p for p in rank_processes(set(self.jobs)) if p.job_id == job]
        if ranks:
            with contextlib.suppress(ProcessLookupError):
                os.kill(min(ranks, key=lambda p: p.pid).pid, signal.SIGKILL)

    # ------------------------------------------------------------ after every step

    async def settled(self) -> Folded:
        """The log once every held gang's ranks have started and every waiting job has a
        reason, or as it is after SETTLE_S."""
        deadline = time.monotonic() + SETTLE_S
        while True:
            folded = await fold(self.system)
            quiet = not folded.unstarted() and not folded.auditor.unexplained()
            if quiet or time.monotonic() > deadline:
                return folded
            await asyncio.sleep(0.5)

    @invariant()
    def the_system_keeps_the_lifecycle_invariants(self) -> None:
        folded = self.wait(self.settled())
        # gangway audit: the log's invariants, and a reason for every waiting job.
        assert folded.auditor.violations == []
        assert folded.auditor.unexplained() == []
        # Every reserved gang has all its ranks started or a launch deadline pending.
        timeout = SchedulingPolicy().launch_timeout_s
        for key in folded.unstarted():
            assert time.time() < folded.reserved_at[key] + timeout, f"{key} never started"
        # No GPU hosts ranks of two attempts: in the log ...
        holders: dict[tuple[str, int], Attempt] = {}
        for (job, attempt, rank), node in folded.running.items():
            placement = folded.gangs[(job, attempt)].ranks[rank]
            for gpu in placement.gpus:
                other = holders.setdefault((node, gpu), (job, attempt))
                assert other == (job, attempt), f"log: GPU {gpu} of {node}: {other}, {job}"
        # ... and on the machine.
        on_gpu: dict[tuple[str, int], Attempt] = {}
        for process in rank_processes(self.submitted):
            for gpu in process.gpus:
                key = (process.job_id, process.attempt)
                other = on_gpu.setdefault((process.node_id, gpu), key)
                assert other == key, f"processes: GPU {gpu} of {process.node_id}: {other}, {key}"

    def teardown(self) -> None:
        """Cancel this example's jobs and wait for their ranks to go: the next starts clean."""
        for job in self.jobs:
            self.wait(self._post(f"/v1/jobs/{job}/cancel"))
        deadline = time.monotonic() + SETTLE_S
        while rank_processes(set(self.jobs)) and time.monotonic() < deadline:
            time.sleep(0.2)


async def test_the_real_services_keep_the_lifecycle_invariants(system: System) -> None:
    RealLifecycle.system = system
    RealLifecycle.loop = asyncio.get_running_loop()
    await asyncio.to_thread(
        run_state_machine_as_test,
        RealLifecycle,
        settings=settings(
            max_examples=3,
            stateful_step_count=8,
            derandomize=True,
            database=None,
            deadline=None,
            suppress_health_check=list(HealthCheck),
        ),
    )
