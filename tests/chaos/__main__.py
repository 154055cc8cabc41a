"""`make chaos` (`python -m tests.chaos`): Gangway's own infrastructure fails under load.

On its own PostgreSQL and Kafka (own directories, free loopback ports below the ephemeral
range) and its own state directory, it starts every service under the supervisor with a
simulated fleet, then runs each scenario under a stream of submissions (POST /v1/jobs with an
Idempotency-Key, retried on 503 until acknowledged):

    broker restart (short), broker outage (15 s), database restart, database outage (15 s),
    scheduler leader SIGKILL x20, scheduler leader SIGSTOP.

Each scenario ends with the checks: every acknowledged job is in the log, no 500, no NodeLost
recorded, no process exited (but the ones it killed), the core's auditor finds nothing,
`gangway audit` and `gangway replay --verify` pass. It prints a table of what it did and what
held, and exits 1 if anything did not. Bounded: it stops itself after GANGWAY_CHAOS_DEADLINE_S
(default 900 s), and always stops what it started. Not part of `make test`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpx

from schemas.jobs import GangReserved
from schemas.leadership import LeaderElected
from services.runtime.errors import DATABASE_UNAVAILABLE
from tests.chaos.stack import ROOT, ChaosStack
from tests.e2e.system import System, running_system

CLUSTER = "8x8:4:2"
TEAM = "chaos"
SUBMIT_EVERY_S = 0.3
OUTAGE_S = 15.0
KILLS = 20
PATIENCE_S = 120.0
JOB = {
    "name": "chaos",
    "team": TEAM,
    "tasks": 1,
    "gpus_per_task": 2,
    "command": ["sleep", "1"],
    "estimated_runtime_s": 5,
}


def say(message: str) -> None:
    print(f"[chaos] {time.strftime('%H:%M:%S')} {message}", flush=True)


@dataclass
class Result:
    name: str
    fault: str
    acked: int = 0
    lost: int = 0
    unavailable: int = 0  # 503 answers (then retried)
    server_errors: int = 0  # any other 5xx: must stay 0
    node_lost: int = 0
    exits: int = 0  # processes that exited, beyond the ones the scenario killed
    audit: bool = False
    replay: bool = False
    measure: str = ""
    times: list[float] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def held(self) -> bool:
        return (
            self.lost == 0
            and self.server_errors == 0
            and self.node_lost == 0
            and self.exits == 0
            and self.audit
            and self.replay
        )

    def timing(self) -> str:
        if not self.times:
            return "-"
        if len(self.times) == 1:
            return f"{self.measure} {self.times[0]:.2f} s"
        return (
            f"{self.measure} median {statistics.median(self.times):.2f} s "
            f"(min {min(self.times):.2f}, max {max(self.times):.2f})"
        )


class Workload:
    """Submits a job every SUBMIT_EVERY_S, each retried with its Idempotency-Key until the API
    acknowledges it (201): an acknowledged job must never be lost."""

    def __init__(self, system: System, name: str) -> None:
        self.system = system
        self.name = name
        self.acked: dict[str, str] = {}
        self.unavailable = 0
        self.server_errors = 0
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            await self._task

    async def _run(self) -> None:
        async with self.system.client() as client:
            n = 0
            while not self._stop.is_set():
                n += 1
                await self.submit(client, f"{self.name}-{n}")
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), SUBMIT_EVERY_S)

    async def submit(
        self, client: httpx.AsyncClient, key: str, *, until_acked: bool = False
    ) -> str:
        while until_acked or not self._stop.is_set():
            try:
                response = await client.post(
                    "/v1/jobs", json=JOB, headers={"Idempotency-Key": key}, timeout=10
                )
            except httpx.HTTPError:
                await asyncio.sleep(0.5)
                continue
            if response.status_code == 201:
                job_id = str(response.json()["id"])
                self.acked[key] = job_id
                return job_id
            if response.status_code == 503:
                self.unavailable += 1
                await asyncio.sleep(min(1.0, float(response.headers.get("retry-after", "1"))))
                continue
            if response.status_code >= 500:
                self.server_errors += 1
                await asyncio.sleep(0.5)
                continue
            raise RuntimeError(f"submission refused: {response.status_code} {response.text}")
        return ""


T = TypeVar("T")


async def retry_db(call: Callable[[], Awaitable[T]]) -> T:
    """`call()`, retried while the database is away (the checks run across outages too)."""
    deadline = time.monotonic() + PATIENCE_S
    while True:
        try:
            return await call()
        except DATABASE_UNAVAILABLE:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


async def until(
    probe: Callable[[], Awaitable[Any]], what: str, patience_s: float = PATIENCE_S
) -> Any:
    deadline = time.monotonic() + patience_s
    while True:
        with contextlib.suppress(*DATABASE_UNAVAILABLE):
            found = await probe()
            if found:
                return found
        if time.monotonic() > deadline:
            raise AssertionError(f"never happened within {patience_s:.0f} s: {what}")
        await asyncio.sleep(0.05)


class Chaos:
    def __init__(self, system: System, stack: ChaosStack) -> None:
        self.system = system
        self.stack = stack

    # ------------------------------------------------------------------ observations

    async def head(self) -> int:
        return await retry_db(self.system.store.head)

    async def count(self, sql: str, *args: Any) -> int:
        async def run() -> int:
            async with self.system.store.pool.acquire() as conn:
                return int(await conn.fetchval(sql, *args))

        return await retry_db(run)

    def log_offsets(self) -> dict[str, int]:
        return {name: len(self.system.launcher.read_log(name)) for name in self.system.specs}

    def exits_since(self, offsets: dict[str, int]) -> dict[str, int]:
        found = {}
        for name, offset in offsets.items():
            exits = self.system.launcher.read_log(name)[offset:].count("exited with status")
            if exits:
                found[name] = exits
        return found

    async def reserved(self, job_id: str) -> bool:
        history = await self.system.store.read_stream(f"job-{job_id}")
        return any(isinstance(e.payload, GangReserved) for e in history)

    async def probe_recovery(self, workload: Workload, since: float, key: str) -> float:
        """Seconds from `since` (the server back) until a job submitted then is reserved."""
        async with self.system.client() as client:
            job_id = await workload.submit(client, key, until_acked=True)
        await until(lambda: self.reserved(job_id), f"probe job {job_id} reserved")
        return time.monotonic() - since

    # ------------------------------------------------------------------ one scenario

    async def scenario(
        self,
        name: str,
        fault: str,
        act: Callable[[Workload, Result], Awaitable[dict[str, int]]],
    ) -> Result:
        """Run `act` under a stream of submissions, then check what held. `act` returns the
        exits it caused on purpose, by service name."""
        say(f"{name}: {fault}")
        result = Result(name, fault)
        start = await self.head()
        offsets = self.log_offsets()
        workload = Workload(self.system, name)
        workload.start()
        await asyncio.sleep(3)
        try:
            intended = await act(workload, result)
            await asyncio.sleep(3)
        finally:
            await workload.stop()
        result.acked = len(workload.acked)
        result.unavailable = workload.unavailable
        result.server_errors = workload.server_errors
        await self.check(result, workload, start, offsets, intended)
        say(f"{name}: {'held' if result.held else 'FAILED'} ({result.timing()})")
        return result

    async def check(
        self,
        result: Result,
        workload: Workload,
        start: int,
        offsets: dict[str, int],
        intended: dict[str, int],
    ) -> None:
        submitted = await self.count(
            "SELECT count(DISTINCT stream) FROM events WHERE type = 'JobSubmitted' "
            "AND stream = ANY($1::text[])",
            [f"job-{job_id}" for job_id in workload.acked.values()],
        )
        result.lost = len(set(workload.acked.values())) - submitted
        duplicates = await self.count(
            "SELECT count(*) - count(DISTINCT stream) FROM events WHERE type = 'JobSubmitted' "
            "AND position > $1",
            start,
        )
        if duplicates:
            result.notes.append(f"{duplicates} duplicate submissions")
            result.lost += duplicates
        result.node_lost = await self.count(
            "SELECT count(*) FROM events WHERE type = 'NodeLost' AND position > $1", start
        )
        exits = self.exits_since(offsets)
        unexpected = {
            name: count - intended.get(name, 0)
            for name, count in exits.items()
            if count != intended.get(name, 0)
        }
        result.exits = sum(abs(n) for n in unexpected.values())
        if unexpected:
            result.notes.append(f"exits: {unexpected}")

        async def quiet() -> bool:
            violations, unexplained = await self.system.audit()
            if violations:
                result.notes.append(f"violations: {violations[:3]}")
                return True
            return not unexplained

        try:
            await until(quiet, "every job decided")
        except AssertionError as error:
            result.notes.append(str(error))
        result.audit = self.cli("audit")
        result.replay = self.cli("replay", "--verify")

    def cli(self, *args: str) -> bool:
        env = {
            **os.environ,
            "GANGWAY_PG_DSN": self.system.settings.pg_dsn,
            "GANGWAY_API_URL": self.system.api_url,
            "GANGWAY_TOKEN": self.system.admin_token,
        }
        done = subprocess.run(
            [sys.executable, "-m", "gangway.cli", *args],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        if done.returncode != 0:
            say(f"gangway {' '.join(args)} failed:\n{done.stdout}{done.stderr}")
        return done.returncode == 0

    # ------------------------------------------------------------------ the faults

    def stack_verb(self, verb: str) -> None:
        self.stack.run(verb)

    def outage(
        self, stop_verb: str, start_verb: str, down_s: float, key: str
    ) -> Callable[[Workload, Result], Awaitable[dict[str, int]]]:
        async def act(workload: Workload, result: Result) -> dict[str, int]:
            await asyncio.to_thread(self.stack_verb, stop_verb)
            await asyncio.sleep(down_s)
            await asyncio.to_thread(self.stack_verb, start_verb)
            back = time.monotonic()
            result.measure = "recovery"
            result.times.append(await self.probe_recovery(workload, back, key))
            return {}

        return act

    async def leader(self) -> LeaderElected:
        found = await until(self.system.leader, "a scheduler leader")
        assert isinstance(found, LeaderElected)
        return found

    async def new_leader(self, epoch: int) -> LeaderElected:
        async def newer() -> LeaderElected | None:
            leader = await self.system.leader()
            return leader if leader is not None and leader.epoch > epoch else None

        found = await until(newer, f"a leader after epoch {epoch}")
        assert isinstance(found, LeaderElected)
        return found

    async def kill_leaders(self, workload: Workload, result: Result) -> dict[str, int]:
        result.measure = "failover"
        killed: dict[str, int] = {}
        for _ in range(KILLS):
            leader = await self.leader()
            name = leader.leader_id
            offset = len(self.system.launcher.read_log(name))
            pid = self.system.launcher.service_pid(name)
            began = time.monotonic()
            self.system.launcher.kill(name, signal.SIGKILL)
            await self.new_leader(leader.epoch)
            result.times.append(time.monotonic() - began)
            killed[name] = killed.get(name, 0) + 1

            async def standing_by(
                name: str = name, offset: int = offset, pid: int | None = pid
            ) -> bool:
                restarted = self.system.launcher.service_pid(name) not in (None, pid)
                log = self.system.launcher.read_log(name)[offset:]
                return restarted and "stands by for the leader lock" in log

            # The supervisor starts the killed replica again; it stands by for the next kill.
            await until(standing_by, f"{name} restarted and standing by")
        return killed

    async def pause_leader(self, workload: Workload, result: Result) -> dict[str, int]:
        result.measure = "failover"
        leader = await self.leader()
        name = leader.leader_id
        offset = len(self.system.launcher.read_log(name))
        began = time.monotonic()
        self.system.launcher.kill(name, signal.SIGSTOP)
        try:
            await self.new_leader(leader.epoch)
            result.times.append(time.monotonic() - began)
            await asyncio.sleep(2)
        finally:
            self.system.launcher.kill(name, signal.SIGCONT)

        async def stood_down() -> bool:
            return "standing by again" in self.system.launcher.read_log(name)[offset:]

        await until(stood_down, f"the woken {name} stands by again")
        return {}


def table(results: list[Result]) -> str:
    header = (
        "scenario",
        "acked",
        "lost",
        "503s",
        "500s",
        "NodeLost",
        "exits",
        "audit",
        "replay",
        "held",
        "measured",
    )
    rows = [
        (
            r.name,
            str(r.acked),
            str(r.lost),
            str(r.unavailable),
            str(r.server_errors),
            str(r.node_lost),
            str(r.exits),
            "ok" if r.audit else "FAIL",
            "ok" if r.replay else "FAIL",
            "yes" if r.held else "NO",
            r.timing(),
        )
        for r in results
    ]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]

    def line(row: tuple[str, ...]) -> str:
        return "| " + " | ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) + " |"

    out = [line(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    out += [line(row) for row in rows]
    faults = [
        f"- {r.name}: {r.fault}" + (f" ({'; '.join(r.notes)})" if r.notes else "") for r in results
    ]
    return "\n".join([*out, "", *faults])


async def main() -> int:
    # This process's own pool retries across the database outages; one line each is enough.
    logging.getLogger("asyncpg").setLevel(logging.ERROR)
    deadline_s = float(os.environ.get("GANGWAY_CHAOS_DEADLINE_S", "900"))
    rng = random.Random()
    directory = ROOT / ".chaos" / time.strftime("%Y%m%dT%H%M%S")
    directory.mkdir(parents=True)
    stack = ChaosStack.create(directory, rng)
    say(
        f"own stack in {directory}: PostgreSQL :{stack.pg_port}, Kafka :{stack.kafka_port} "
        f"(controller :{stack.controller_port})"
    )
    results: list[Result] = []
    began = time.monotonic()
    try:
        await asyncio.to_thread(stack.run, "up")
        async with asyncio.timeout(deadline_s):
            async with running_system(
                stack.stack(), directory / "state", cluster=CLUSTER, supervise=True
            ) as system:
                say(
                    f"system up ({CLUSTER}) in {time.monotonic() - began:.0f} s; "
                    f"API {system.api_url}"
                )
                async with system.client() as client:
                    created = await client.post(
                        "/v1/teams",
                        json={"name": TEAM, "guaranteed_gpus": 64, "max_gpus": 64},
                    )
                    assert created.status_code == 201, created.text
                chaos = Chaos(system, stack)
                plan = [
                    (
                        "broker-restart",
                        "Kafka stopped and started at once",
                        chaos.outage("kafka-stop", "kafka-start", 0, "probe-broker-restart"),
                    ),
                    (
                        "broker-outage",
                        f"Kafka down {OUTAGE_S:.0f} s",
                        chaos.outage("kafka-stop", "kafka-start", OUTAGE_S, "probe-broker-outage"),
                    ),
                    (
                        "database-restart",
                        "PostgreSQL stopped (fast) and started at once",
                        chaos.outage("pg-stop", "pg-start", 0, "probe-database-restart"),
                    ),
                    (
                        "database-outage",
                        f"PostgreSQL down {OUTAGE_S:.0f} s",
                        chaos.outage("pg-stop", "pg-start", OUTAGE_S, "probe-database-outage"),
                    ),
                    ("leader-sigkill", f"scheduler leader SIGKILLed x{KILLS}", chaos.kill_leaders),
                    (
                        "leader-sigstop",
                        "scheduler leader SIGSTOPped until replaced, then woken",
                        chaos.pause_leader,
                    ),
                ]
                for name, fault, act in plan:
                    results.append(await chaos.scenario(name, fault, act))
    except TimeoutError:
        say(f"deadline of {deadline_s:.0f} s reached; stopping")
    finally:
        with contextlib.suppress(Exception):
            await asyncio.to_thread(stack.run, "down")
        shutil.rmtree(directory / "stack", ignore_errors=True)
    print()
    print(table(results))
    print()
    held = len(results) == 6 and all(r.held for r in results)
    say(
        f"{'all held' if held else 'NOT ALL HELD'} in {time.monotonic() - began:.0f} s; "
        f"service logs in {directory / 'state' / 'logs'}"
    )
    return 0 if held else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
