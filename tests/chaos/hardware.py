"""`python -m tests.chaos.hardware`: slices, MPS shares and CPU-only jobs through restarts.

On its own PostgreSQL and Kafka (GANGWAY_STACK_PG_PORT, GANGWAY_STACK_KAFKA_PORT and
GANGWAY_STACK_KAFKA_CONTROLLER_PORT, else free ports), with every service a supervised process,
it runs MIG slices, MPS and timeslice shares, whole GPUs and CPU-only gangs of several teams,
then restarts PostgreSQL, restarts Kafka, and kill -9s the scheduler and the agent, submitting
all along. After each fault it checks that

- every acknowledged job is in the log, and the core's auditor finds nothing (no GPU, slice or
  share bound twice, no soft-shared GPU of two teams);
- the rank processes that really run (found in /proc, by their GANGWAY_* variables) are
  exactly the ranks the log says hold their devices, each with the device variables
  (CUDA_VISIBLE_DEVICES, the MIG device UUID, the MPS percentage and memory limit) that its
  placement in the log gives it, and no device is held by two live ranks.

It prints what it found and exits 1 on any mismatch. Not part of `make test`.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from schemas.jobs import JobSubmitted
from services.agent.devices import device_env
from services.agent.plan import fold_job
from tests.chaos.stack import ROOT, ChaosStack
from tests.e2e.system import System, running_system

CLUSTER = """groups:
  - {count: 1, gpus: 2, gpu_type: H100, mig: dynamic, reconfigure_s: 1, cpus: 16, memory_mb: 65536}
  - {count: 2, gpus: 2, gpu_type: H100, cpus: 16, memory_mb: 65536}
"""
SLEEP = ["sleep", "3600"]
DEVICE_VARS = (
    "CUDA_VISIBLE_DEVICES",
    "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
    "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
)
PATIENCE_S = 180.0


def say(message: str) -> None:
    print(f"[hw] {time.strftime('%H:%M:%S')} {message}", flush=True)


def workload() -> list[dict[str, Any]]:
    slices = [{"team": "ta", "gpus_per_task": 0, "mig_profile": "1g.10gb"} for _ in range(3)]
    slices.append({"team": "tb", "gpus_per_task": 0, "mig_profile": "2g.20gb"})
    shares = [
        {"team": "tb", "gpus_per_task": 0, "gpu_fraction": 0.25, "sharing": "mps"},
        {"team": "tb", "gpus_per_task": 0, "gpu_fraction": 0.25, "sharing": "mps"},
        {"team": "tc", "gpus_per_task": 0, "gpu_fraction": 0.5, "sharing": "mps"},
        {"team": "tc", "gpus_per_task": 0, "gpu_fraction": 0.5, "sharing": "timeslice"},
    ]
    cpu_only = [{"team": "tc", "tasks": 4, "gpus_per_task": 0, "cpus_per_task": 1}]
    whole = [{"team": "ta", "gpus_per_task": 1, "cpus_per_task": 2}]
    return [
        {"name": f"hw-{i}", "command": SLEEP, **spec}
        for i, spec in enumerate(slices + shares + cpu_only + whole)
    ]


@dataclass
class Live:
    pid: int
    job: str
    attempt: int
    rank: int
    node: str
    devices: dict[str, str]


def live_ranks(work_dir: Path) -> dict[tuple[str, int, int], Live]:
    """Rank processes whose working directory is under `work_dir`, by (job, attempt, rank):
    the outermost process of each (its children inherit the same variables)."""
    found: dict[tuple[str, int, int], Live] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cwd = os.readlink(entry / "cwd")
            raw = (entry / "environ").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state == "Z" or not cwd.startswith(str(work_dir)):
            continue
        env = dict(
            item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item
        )
        if "GANGWAY_JOB_ID" not in env:
            continue
        key = (env["GANGWAY_JOB_ID"], int(env["GANGWAY_ATTEMPT"]), int(env["GANGWAY_RANK"]))
        pid = int(entry.name)
        if key not in found or pid < found[key].pid:
            devices = {name: env[name] for name in DEVICE_VARS if name in env}
            found[key] = Live(pid, *key, env.get("GANGWAY_NODE_ID", ""), devices)
    return found


async def ledger(system: System, job_ids: list[str]) -> dict[tuple[str, int, int], dict[str, Any]]:
    """The ranks the log says hold their devices now (started, not exited, attempt not
    released), with the device variables their placement gives them."""
    held: dict[tuple[str, int, int], dict[str, Any]] = {}
    for job_id in job_ids:
        view = fold_job(e.payload for e in await system.store.read_stream(f"job-{job_id}"))
        if view.spec is None:
            continue
        for attempt, gang in view.gangs.items():
            if attempt in view.released:
                continue
            for placement in gang.ranks:
                key = (attempt, placement.rank)
                if key in view.started and key not in view.exited:
                    devices = device_env(view.spec, placement, gpu_memory_mb=_memory(placement))
                    held[(job_id, attempt, placement.rank)] = {
                        "node": placement.node_id,
                        "devices": devices,
                        "team": view.spec.team,
                        "gpus": tuple(placement.gpus),
                        "sliced": placement.mig is not None,
                        "share": placement.share is not None,
                    }
    return held


def _memory(placement: Any) -> dict[int, int]:
    return {gpu: 81920 for gpu in placement.gpus}  # the simulated H100's memory


def compare(
    held: dict[tuple[str, int, int], dict[str, Any]], live: dict[tuple[str, int, int], Live]
) -> list[str]:
    problems: list[str] = []
    for key in sorted(set(live) - set(held)):
        problems.append(f"process {live[key].pid} runs {key}, which the log says holds nothing")
    for key in sorted(set(held) - set(live)):
        problems.append(f"the log says {key} runs on {held[key]['node']}; no process does")
    for key in sorted(set(held) & set(live)):
        if live[key].node != held[key]["node"]:
            problems.append(f"{key}: on {live[key].node}, the log says {held[key]['node']}")
        if live[key].devices != held[key]["devices"]:
            problems.append(f"{key}: devices {live[key].devices} != log's {held[key]['devices']}")
    # No device held twice by live ranks: a whole GPU or MIG device by one rank; a soft-shared
    # GPU by one team.
    exclusive: Counter[tuple[str, str]] = Counter()
    teams: dict[tuple[str, str], set[str]] = {}
    for key, rank in live.items():
        entry = held.get(key)
        cvd = rank.devices.get("CUDA_VISIBLE_DEVICES", "")
        shared = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" in rank.devices or (
            entry is not None and entry["share"]
        )
        for device in filter(None, cvd.split(",")):
            if shared:
                teams.setdefault((rank.node, device), set()).add(entry["team"] if entry else "?")
            else:
                exclusive[(rank.node, device)] += 1
    problems += [f"device {d} held by {n} live ranks" for d, n in exclusive.items() if n > 1]
    problems += [f"shared GPU {d} of teams {sorted(t)}" for d, t in teams.items() if len(t) > 1]
    clash = set(exclusive) & set(teams)
    problems += [f"GPU {d} both shared and held whole" for d in sorted(clash)]
    return problems


async def settle(system: System, job_ids: list[str], work_dir: Path, what: str) -> list[str]:
    """Compare the log and /proc until every rank of every job runs and they agree (the
    system converges: every job sleeps for an hour and the fleet holds them all), or time
    runs out."""
    deadline = time.monotonic() + PATIENCE_S
    problems: list[str] = []
    expected = 0
    for job_id in job_ids:
        view = fold_job(e.payload for e in await system.store.read_stream(f"job-{job_id}"))
        if view.spec is not None and not view.terminal:
            expected += view.spec.tasks
    started = time.monotonic()
    while time.monotonic() < deadline:
        held = await ledger(system, job_ids)
        problems = compare(held, live_ranks(work_dir))
        if not problems and len(held) == expected:
            took = time.monotonic() - started
            say(f"{what}: all {expected} ranks run as the log says (converged in {took:.0f} s)")
            return []
        await asyncio.sleep(1.0)
    problems.append(f"{len(held)} of {expected} ranks held")
    say(f"{what}: MISMATCH after {PATIENCE_S:.0f} s")
    async with system.client() as admin:
        for job_id in job_ids:
            job = (await admin.get(f"/v1/jobs/{job_id}")).json()
            if job.get("state") != "running":
                problems.append(f"{job_id}: {job.get('state')} ({job.get('reason')})")
    for problem in problems:
        say(f"  {problem}")
    return problems


async def submit(system: System, tokens: dict[str, str], spec: dict[str, Any]) -> str | None:
    """POST until acknowledged (503 while the stack is down); None if never."""
    deadline = time.monotonic() + PATIENCE_S
    key = f"hw-{random.getrandbits(64):x}"
    async with system.client(tokens[spec["team"]]) as api:
        while time.monotonic() < deadline:
            try:
                response = await api.post("/v1/jobs", json=spec, headers={"Idempotency-Key": key})
            except httpx.HTTPError:  # the API may be unreachable meanwhile
                await asyncio.sleep(0.5)
                continue
            if response.status_code == 201:
                return str(response.json()["id"])
            if response.status_code >= 500 and response.status_code != 503:
                say(f"submit answered {response.status_code}: {response.text[:200]}")
            if response.status_code < 500:
                say(f"submit refused {response.status_code}: {response.text[:300]}")
                return None
            await asyncio.sleep(0.5)
    return None


async def checks(system: System, acked: list[str], work_dir: Path, what: str) -> list[str]:
    problems = []
    for job_id in acked:
        stream = await system.store.read_stream(f"job-{job_id}")
        if not any(isinstance(e.payload, JobSubmitted) for e in stream):
            problems.append(f"acknowledged job {job_id} is not in the log")
    violations, _ = await system.audit()
    problems += [f"auditor: {v}" for v in violations]
    problems += await settle(system, acked, work_dir, what)
    return problems


async def scenario(stack: ChaosStack, state_dir: Path) -> list[str]:
    cluster = state_dir / "cluster.yaml"
    cluster.write_text(CLUSTER)
    work_dir = state_dir / "agent"
    problems: list[str] = []
    async with running_system(
        stack.stack(), state_dir, cluster=str(cluster), scheduler_replicas=1, supervise=True
    ) as system:
        tokens = {
            team: await system.create_team(team, guaranteed_gpus=1) for team in ("ta", "tb", "tc")
        }
        acked = [job for spec in workload() if (job := await submit(system, tokens, spec))]
        say(f"{len(acked)} jobs acknowledged")
        problems += await checks(system, acked, work_dir, "baseline")

        async def fault(what: str, action: Any) -> None:
            extra = asyncio.create_task(
                submit(
                    system,
                    tokens,
                    {
                        "name": "late",
                        "team": "tc",
                        "command": SLEEP,
                        "gpus_per_task": 0,
                        "cpus_per_task": 1,
                    },
                )
            )
            await action()
            job = await extra
            if job is None:
                problems.append(f"{what}: a submission was never acknowledged")
            else:
                acked.append(job)
            problems.extend(await checks(system, acked, work_dir, what))

        async def restart(down: str, up: str) -> None:
            stack.run(down)
            await asyncio.sleep(10)
            stack.run(up)

        await fault("postgres restart", lambda: restart("pg-stop", "pg-start"))
        await fault("kafka restart", lambda: restart("kafka-stop", "kafka-start"))

        async def kill(name: str) -> None:
            system.launcher.kill(name, signal.SIGKILL)
            await asyncio.sleep(5)

        await fault("scheduler kill -9", lambda: kill("scheduler"))
        await fault("agent kill -9", lambda: kill("agent"))

        # A large CPU-only gang: the agent killed while it starts its ranks.
        big = await submit(system, tokens, large_gang("big-killed"))
        if big is not None:
            acked.append(big)
            await first_rank_started(system, big)
            system.launcher.kill("agent", signal.SIGKILL)
            problems.extend(await checks(system, acked, work_dir, "agent kill -9 mid-launch"))

        # A large CPU-only gang cancelled while it starts: its launch stops, and another
        # job's rank starts without waiting for it.
        doomed = await submit(system, tokens, large_gang("big-cancelled"))
        if doomed is not None:
            acked.append(doomed)
            await first_rank_started(system, doomed)
            began = time.monotonic()
            async with system.client(tokens["tc"]) as api:
                cancelled = await api.post(f"/v1/jobs/{doomed}/cancel")
                say(f"cancel answered {cancelled.status_code}")
            small = await submit(
                system,
                tokens,
                {
                    "name": "small",
                    "team": "ta",
                    "command": SLEEP,
                    "gpus_per_task": 0,
                    "cpus_per_task": 0.5,
                },
            )
            if small is not None:
                acked.append(small)
                await first_rank_started(system, small)
                took = time.monotonic() - began
                say(f"a small job submitted after the cancel started {took:.1f} s after it")
            problems.extend(await checks(system, acked, work_dir, "cancel mid-launch"))
    return problems


def large_gang(name: str) -> dict[str, Any]:
    return {
        "name": name,
        "team": "tc",
        "tasks": 64,
        "gpus_per_task": 0,
        "cpus_per_task": 0.125,
        "command": SLEEP,
    }


async def first_rank_started(system: System, job_id: str) -> None:
    deadline = time.monotonic() + PATIENCE_S
    while time.monotonic() < deadline:
        stream = await system.store.read_stream(f"job-{job_id}")
        if any(e.type == "TaskStarted" for e in stream):
            return
        await asyncio.sleep(0.05)
    say(f"{job_id} never started")


def main() -> int:
    base = ROOT / ".chaos" / "hardware"
    base.mkdir(parents=True, exist_ok=True)
    env = os.environ
    ports = [
        env.get("GANGWAY_STACK_PG_PORT"),
        env.get("GANGWAY_STACK_KAFKA_PORT"),
        env.get("GANGWAY_STACK_KAFKA_CONTROLLER_PORT"),
    ]
    if all(ports):
        stack = ChaosStack(base, *(int(port) for port in ports if port))
    else:
        stack = ChaosStack.create(base, random.Random())
    say(f"stack on {stack.pg_port}/{stack.kafka_port}")
    stack.run("up")
    try:
        state_dir = base / f"run-{int(time.time())}"
        state_dir.mkdir()
        problems = asyncio.run(scenario(stack, state_dir))
    finally:
        stack.run("down")
    say("HELD" if not problems else f"{len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
