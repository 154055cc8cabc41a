"""The whole submission pipeline as processes: REST API → log → relay → Kafka → admission →
scheduler → GangReserved (issue 15: 1,000 jobs a second end to end).

Starts relay, admission, one scheduler and the API (`--api-workers` processes on one port)
with gangway/launcher.py on a scratch database and topic prefix; the cluster's nodes are
registered straight into the log (as the fleet would), large enough that every 1-GPU job of
the run is reserved without any finishing, and no agent runs, so reserved gangs stay reserved.

1. latency: one job at a time on an idle cluster; from the POST being sent to the GangReserved
   being seen (LISTEN/NOTIFY on the log), and inside the system from JobSubmitted's to
   GangReserved's recorded time. Target: p99 < 50 ms.
2. single submissions: `--jobs` POST /v1/jobs from `--clients` concurrent clients; jobs
   reserved per second from the first POST to the last GangReserved. Target: >= 1,000 jobs/s.
3. batches: `--batch-jobs` in POST /v1/jobs:batch of `--batch-size` from `--batch-clients`
   clients. Target: >= 5,000 jobs/s.
Beside each rate, the CPU time each service spent per job (from /proc, the API's workers
included): unlike the rates it hardly depends on what else the machine's cores are doing, so
runs on a busy machine still compare. The machine's load average is printed before and after.
`--behind-api` also appends submissions straight to the log (relay → admission → scheduler
alone).

Run: `python bench/bench_pipeline.py [--jobs 3000 --clients 32 --latency-jobs 200]`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import asyncpg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from core.topology import parse_cluster_spec
from gangway.launcher import (
    Launcher,
    api_workers,
    default_services,
    ensure_admin_token,
    free_port,
    service_order,
)
from schemas.jobs import JobAdmitted, JobSpec, JobSubmitted
from services.runtime import (
    NOTIFY_CHANNEL,
    EventStore,
    Settings,
    StreamAppend,
    migrate_settings,
)
from services.runtime.kafka import client_environment
from services.runtime.scratch import scratch_database, with_database
from services.runtime.topics import ensure_topics

# At least 10,000 GPUs, and room for every 1-GPU job of the runs without any finishing.
MIN_NODES = 1250
SERVICES = ("relay", "admission", "scheduler", "api")


@contextlib.asynccontextmanager
async def pipeline(
    state_dir: Path, cluster: str, api_workers: int, profile: str | None = None
) -> AsyncIterator[tuple[Settings, str, str]]:
    base = Settings()
    tag = uuid.uuid4().hex[:8]
    async with (
        scratch_database(base.migration_dsn, f"gw_bench_pipeline_{tag}") as database,
        _running(base, database, tag, state_dir, cluster, api_workers, profile) as running,
    ):
        yield running


@contextlib.asynccontextmanager
async def _running(
    base: Settings,
    database: str,
    tag: str,
    state_dir: Path,
    cluster: str,
    api_workers: int,
    profile: str | None,
) -> AsyncIterator[tuple[Settings, str, str]]:
    def dsn(url: str) -> str:
        return with_database(url, database)

    api_url = f"http://127.0.0.1:{free_port()}"
    settings = Settings.model_validate(
        {
            **base.model_dump(),
            "pg_dsn": dsn(base.pg_dsn),
            "pg_owner_dsn": dsn(base.migration_dsn),
            "topic_prefix": f"bench-{tag}",
            "api_url": api_url,
        }
    )
    await migrate_settings(settings)
    # Topics and the roles' rights on them, as the broker's admin, as `make up` does: the
    # services may not create them.
    await ensure_topics(settings)
    token_file = state_dir / "admin.token"
    launcher = Launcher(
        state_dir=state_dir,
        env={
            "GANGWAY_PG_DSN": settings.pg_dsn,
            "GANGWAY_PG_OWNER_DSN": settings.migration_dsn,
            **client_environment(settings),
            "GANGWAY_TOPIC_PREFIX": settings.topic_prefix,
            "GANGWAY_API_URL": api_url,
            "GANGWAY_ADMIN_TOKEN_FILE": str(token_file),
            "GANGWAY_CLUSTER": cluster,
            **sampler_env(profile),
        },
    )
    specs = [
        spec
        for spec in default_services(
            cluster=cluster,
            api_url=api_url,
            scheduler_replicas=1,
            metrics_port_base=None,
            api_workers=api_workers,
        )
        if spec.name in SERVICES
    ]
    store = await EventStore.connect(settings, producer="fleet")
    try:
        nodes = parse_cluster_spec(cluster)
        await store.append_many([StreamAppend(n.stream, 0, [n]) for n in nodes])
        launcher.up(specs, timeout_s=120)
        yield settings, api_url, ensure_admin_token(token_file)
    finally:
        launcher.down(service_order(specs))
        await store.close()


class ReservationWatcher:
    """Sees each GangReserved as soon as it is committed (woken by the log's NOTIFY)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.seen: dict[str, float] = {}
        self.position = 0
        self._wake = asyncio.Event()
        self._changed = asyncio.Condition()

    async def run(self, stop: asyncio.Event) -> None:
        store = await EventStore.connect(self.settings, producer="bench")
        listener = await asyncpg.connect(self.settings.pg_dsn)
        await listener.add_listener(NOTIFY_CHANNEL, lambda *_: self._wake.set())
        self.position = await store.head()
        try:
            while not stop.is_set():
                self._wake.clear()
                batch = await store.read_all_raw(self.position, 5000)
                now = time.perf_counter()
                for raw in batch:
                    if raw.type == "GangReserved":
                        self.seen[raw.stream.removeprefix("job-")] = now
                if batch:
                    self.position = batch[-1].position
                    async with self._changed:
                        self._changed.notify_all()
                    continue
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), 0.5)
        finally:
            await listener.close()
            await store.close()

    async def wait_for(self, job_ids: set[str], patience_s: float = 120.0) -> float:
        async with asyncio.timeout(patience_s), self._changed:
            await self._changed.wait_for(lambda: job_ids <= self.seen.keys())
        return max(self.seen[j] for j in job_ids)


class Connection:
    """One keep-alive HTTP/1.1 connection, as lean as a load generator must be: httpx spends
    more CPU per request than the API does and, on two cores, became the bottleneck."""

    def __init__(self, url: str, token: str) -> None:
        parts = urlsplit(url)
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or 80
        self.token = token.encode()
        self._streams: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    async def post(self, path: str, body: dict[str, Any]) -> tuple[int, Any]:
        status, _, answer = await self.send(path, json.dumps(body).encode())
        return status, answer

    async def send(self, path: str, payload: bytes) -> tuple[int, dict[str, str], Any]:
        """POST a body already encoded; the status, the answer's headers and its body."""
        if self._streams is None:
            self._streams = await asyncio.open_connection(self.host, self.port)
        reader, writer = self._streams
        writer.write(
            b"POST "
            + path.encode()
            + b" HTTP/1.1\r\nHost: "
            + self.host.encode()
            + b"\r\nAuthorization: Bearer "
            + self.token
            + b"\r\nContent-Type: application/json\r\nContent-Length: "
            + str(len(payload)).encode()
            + b"\r\n\r\n"
            + payload
        )
        await writer.drain()
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        status = int(lines[0].split()[1])
        headers = {}
        for line in lines[1:]:
            if b":" in line:
                name, value = line.split(b":", 1)
                headers[name.strip().lower().decode()] = value.strip().decode()
        body = await reader.readexactly(int(headers["content-length"]))
        if headers.get("connection") == "close":
            await self.close()
        return status, headers, json.loads(body)

    async def close(self) -> None:
        if self._streams is not None:
            self._streams[1].close()
            self._streams = None


def listener_pid(port: int) -> int | None:
    """The process listening on TCP `port` here (PostgreSQL's postmaster, Kafka's broker),
    from /proc: sockets in LISTEN state, then the process holding that socket."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                    inodes.add(f"socket:[{fields[9]}]")
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            for fd in (entry / "fd").iterdir():
                with contextlib.suppress(OSError):
                    if os.readlink(fd) in inodes:
                        return int(entry.name)
    return None


def stack_roots(settings: Settings) -> dict[str, int]:
    """The PostgreSQL and Kafka serving this bench, by their listening processes."""
    roots = {}
    for name, url in (
        ("postgres*", settings.pg_dsn),
        ("kafka*", "kafka://" + settings.kafka_bootstrap.split(",")[0]),
    ):
        port = urlsplit(url).port
        pid = None if port is None else listener_pid(port)
        if pid is not None:
            roots[name] = pid
    return roots


def service_cpu_s(state_dir: Path, stack: dict[str, int] | None = None) -> dict[str, float]:
    """CPU seconds (user + system) each launched service has used so far, its children
    included (uvicorn's workers, say), by the launcher's pid files; and beside them those of
    `stack` (PostgreSQL and Kafka, starred: other users of the same stack count too) and the
    bench's own."""
    tick = os.sysconf("SC_CLK_TCK")
    parents: dict[int, int] = {}
    used: dict[int, float] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(entry.name)] = int(fields[1])
        used[int(entry.name)] = (int(fields[11]) + int(fields[12])) / tick
    roots = {
        pid_file.stem: int(pid_file.read_text().split()[0])
        for pid_file in (state_dir / "pids").glob("*.pid")
    }
    totals: dict[str, float] = {}
    for name, root in {**roots, **(stack or {})}.items():
        family = {root}
        for pid in sorted(parents):
            if parents[pid] in family:
                family.add(pid)
        totals[name] = sum(used.get(pid, 0.0) for pid in family)
    me = os.times()
    totals["bench"] = me.user + me.system
    return totals


SAMPLER = Path(__file__).resolve().parent / "sampler"


def py_spy() -> str | None:
    return os.environ.get("PY_SPY") or shutil.which("py-spy")


def sampler_env(out: str | None) -> dict[str, str]:
    """What the services need to carry bench/sampler's profiler (`--profile` without py-spy)."""
    if out is None or py_spy() is not None:
        return {}
    Path(out).mkdir(parents=True, exist_ok=True)
    path = os.environ.get("PYTHONPATH")
    return {
        "GANGWAY_SAMPLE_DIR": str(Path(out).resolve()),
        "PYTHONPATH": str(SAMPLER) + (os.pathsep + path if path else ""),
    }


def service_families(state_dir: Path) -> dict[str, list[int]]:
    """Each launched service's Python processes, its children (uvicorn's workers) included."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                parents[int(entry.name)] = int(
                    (entry / "stat").read_text().rsplit(")", 1)[1].split()[1]
                )
    families = {}
    for pid_file in (state_dir / "pids").glob("*.pid"):
        family = {int(pid_file.read_text().split()[0])}
        for pid in sorted(parents):
            if parents[pid] in family:
                family.add(pid)
        families[pid_file.stem] = sorted(
            pid
            for pid in family
            if b"python" in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
        )
    return families


@contextlib.contextmanager
def sampled(state_dir: Path, out: str, phase: str) -> Iterator[None]:
    """bench/sampler's profiler in each service's processes during the phase, its stacks in
    `out`/<phase>-<pid>.txt, and `out`/pids-<phase>.json naming each service's pids."""
    folder = Path(out)
    (folder / "phase").write_text(phase)
    families = service_families(state_dir)
    (folder / f"pids-{phase}.json").write_text(json.dumps(families))
    for pids in families.values():
        for pid in pids:
            os.kill(pid, signal.SIGUSR1)
    try:
        yield
    finally:
        for pids in families.values():
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGUSR2)
        time.sleep(1.0)  # each writes its file


@contextlib.contextmanager
def profiled(state_dir: Path, out: str | None, phase: str) -> Iterator[None]:
    """py-spy records each service (its children too) during the phase, as raw collapsed
    stacks in `out`/<phase>-<service>.txt (`--profile`; py-spy on PATH or $PY_SPY); without
    py-spy, bench/sampler's profiler does (see `sampled`)."""
    if out is None:
        yield
        return
    Path(out).mkdir(parents=True, exist_ok=True)
    spy = py_spy()
    if spy is None:
        with sampled(state_dir, out, phase):
            yield
        return
    recorders = [
        subprocess.Popen(
            [
                spy,
                "record",
                "-p",
                pid_file.read_text().split()[0],
                "-s",
                "-r",
                "100",
                "--nonblocking",
                "-f",
                "raw",
                "-o",
                f"{out}/{phase}-{pid_file.stem}.txt",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for pid_file in (state_dir / "pids").glob("*.pid")
    ]
    time.sleep(1.0)  # py-spy attaches
    try:
        yield
    finally:
        for recorder in recorders:
            recorder.send_signal(signal.SIGINT)
        for recorder in recorders:
            recorder.wait(timeout=30)


def job_spec(index: int) -> dict[str, Any]:
    return {"name": f"bench-{index}", "team": "bench", "tasks": 1, "gpus_per_task": 1}


async def submit(api: Connection, index: int) -> str:
    status, body = await api.post("/v1/jobs", job_spec(index))
    if status != 201:
        raise RuntimeError(f"POST /v1/jobs answered {status}: {body}")
    return str(body["id"])


async def submit_batch(api: Connection, indices: list[int]) -> list[str]:
    status, body = await api.post("/v1/jobs:batch", {"jobs": [job_spec(i) for i in indices]})
    if status != 201:
        raise RuntimeError(f"POST /v1/jobs:batch answered {status}: {body}")
    return [str(job["id"]) for job in body["jobs"]]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def latency(api: Connection, watcher: ReservationWatcher, count: int) -> list[float]:
    samples = []
    for index in range(count):
        sent = time.perf_counter()
        job_id = await submit(api, index)
        seen = await watcher.wait_for({job_id})
        samples.append((seen - sent) * 1000)
        # Release nothing: 1-GPU jobs on 10,000 GPUs leave the cluster effectively idle.
    return samples


async def recorded_latencies(settings: Settings, jobs: int) -> dict[str, list[float]]:
    """Inside the system, per job of the latency run (the first `jobs` reserved), from the
    recorded times: submitted → admitted (relay, Kafka, admission), admitted → reserved
    (scheduler), and submitted → reserved."""
    conn = await asyncpg.connect(settings.pg_dsn)
    try:
        rows = await conn.fetch(
            """
            SELECT extract(epoch FROM a.recorded_at - s.recorded_at) * 1000 AS admit_ms,
                   extract(epoch FROM r.recorded_at - a.recorded_at) * 1000 AS reserve_ms,
                   extract(epoch FROM r.recorded_at - s.recorded_at) * 1000 AS total_ms
            FROM events s
            JOIN events a ON a.stream = s.stream AND a.type = 'JobAdmitted'
            JOIN events r ON r.stream = s.stream AND r.type = 'GangReserved'
            WHERE s.type = 'JobSubmitted'
            ORDER BY s.position
            LIMIT $1
            """,
            jobs,
        )
    finally:
        await conn.close()
    return {
        key: [float(row[key]) for row in rows] for key in ("admit_ms", "reserve_ms", "total_ms")
    }


async def throughput(
    connections: list[Connection], watcher: ReservationWatcher, jobs: int, offset: int
) -> tuple[float, float]:
    queue: asyncio.Queue[int] = asyncio.Queue()
    for index in range(offset, offset + jobs):
        queue.put_nowait(index)
    ids: set[str] = set()

    async def client(api: Connection) -> None:
        while not queue.empty():
            ids.add(await submit(api, queue.get_nowait()))

    started = time.perf_counter()
    await asyncio.gather(*(client(api) for api in connections))
    submitted = time.perf_counter()
    last = await watcher.wait_for(ids, patience_s=600)
    return jobs / (submitted - started), jobs / (last - started)


async def batched(
    connections: list[Connection],
    watcher: ReservationWatcher,
    jobs: int,
    offset: int,
    batch_size: int,
) -> tuple[float, float]:
    """`jobs` submitted as POST /v1/jobs:batch of `batch_size` by concurrent clients."""
    queue: asyncio.Queue[list[int]] = asyncio.Queue()
    for start in range(offset, offset + jobs, batch_size):
        queue.put_nowait(list(range(start, min(start + batch_size, offset + jobs))))
    ids: set[str] = set()

    async def client(api: Connection) -> None:
        while not queue.empty():
            ids.update(await submit_batch(api, queue.get_nowait()))

    started = time.perf_counter()
    await asyncio.gather(*(client(api) for api in connections))
    submitted = time.perf_counter()
    last = await watcher.wait_for(ids, patience_s=600)
    return jobs / (submitted - started), jobs / (last - started)


def cpu_line(before: dict[str, float], after: dict[str, float], jobs: int) -> str:
    per_job = {name: (after[name] - before.get(name, 0.0)) * 1000 / jobs for name in sorted(after)}
    services = {name: ms for name, ms in per_job.items() if name in SERVICES}
    others = {name: ms for name, ms in per_job.items() if name not in SERVICES}
    return (
        "  CPU per job: "
        + ", ".join(f"{name} {ms:.2f} ms" for name, ms in services.items())
        + f" (services {sum(services.values()):.2f} ms); "
        + ", ".join(f"{name} {ms:.2f} ms" for name, ms in others.items())
    )


async def stage_timeline(settings: Settings, after: int) -> str:
    """When each stage of a phase wrote its first and last event (from the log's recorded
    times, relative to the phase's first JobSubmitted): which stage trails which."""
    conn = await asyncpg.connect(settings.pg_dsn)
    try:
        rows = await conn.fetch(
            """
            SELECT type, count(*) AS n,
                   extract(epoch FROM min(recorded_at) - t0.at) AS first_s,
                   extract(epoch FROM max(recorded_at) - t0.at) AS last_s
            FROM events,
                 (SELECT min(recorded_at) AS at FROM events
                  WHERE position > $1 AND type = 'JobSubmitted') AS t0
            WHERE position > $1 AND type IN ('JobSubmitted', 'JobAdmitted', 'GangReserved')
            GROUP BY type, t0.at ORDER BY last_s
            """,
            after,
        )
    finally:
        await conn.close()
    return "  stages (first / last event after the phase's first submission): " + ", ".join(
        f"{row['type']} {float(row['first_s']):.2f} / {float(row['last_s']):.2f} s" for row in rows
    )


def load() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.2f} (1 min), {five:.2f} (5 min) on {os.cpu_count()} cores"


async def injected(
    settings: Settings,
    watcher: ReservationWatcher,
    jobs: int,
    offset: int,
    *,
    admitted: bool = False,
) -> tuple[float, float]:
    """Behind the API: JobSubmitted appended straight to the log in batches of 100 (as the API
    would, without HTTP), with JobAdmitted too when `admitted` (the scheduler alone); reserved
    jobs per second."""
    store = await EventStore.connect(settings, producer="api")
    prefix = "adm" if admitted else "inj"
    ids = [f"{prefix}{index:06d}" for index in range(offset, offset + jobs)]
    try:
        started = time.perf_counter()
        for chunk in range(0, jobs, 100):
            await store.append_many(
                [
                    StreamAppend(
                        f"job-{job_id}",
                        0,
                        [
                            JobSubmitted(
                                job_id=job_id,
                                spec=JobSpec.model_validate(job_spec(index)),
                                submitted_by="bench",
                            ),
                            *(
                                [JobAdmitted(job_id=job_id, queue="bench", priority="research")]
                                if admitted
                                else []
                            ),
                        ],
                    )
                    for index, job_id in enumerate(ids[chunk : chunk + 100], start=chunk)
                ]
            )
        appended = time.perf_counter()
        last = await watcher.wait_for(set(ids), patience_s=600)
    finally:
        await store.close()
    return jobs / (appended - started), jobs / (last - started)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=3000, help="single submissions")
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--latency-jobs", type=int, default=200)
    parser.add_argument("--batch-jobs", type=int, default=5000, help="jobs submitted in batches")
    parser.add_argument("--batch-size", type=int, default=500)
    parser.add_argument("--batch-clients", type=int, default=4)
    parser.add_argument(
        "--api-workers",
        type=int,
        default=api_workers(),
        help="API processes on the port (default: as many as make up starts)",
    )
    parser.add_argument(
        "--behind-api", action="store_true", help="also inject submissions behind the API"
    )
    parser.add_argument(
        "--profile",
        help="record each service during each phase (py-spy, else bench/sampler), into this folder",
    )
    parser.add_argument(
        "--state-dir", help="keep the services' logs and pid files here (default: a temporary one)"
    )
    args = parser.parse_args()
    with contextlib.ExitStack() as scope:
        tmp = args.state_dir or scope.enter_context(
            tempfile.TemporaryDirectory(prefix="gangway-bench-")
        )
        await _bench(args, tmp)


async def _bench(args: argparse.Namespace, tmp: str) -> None:
    total = 1 + args.latency_jobs + args.jobs + args.batch_jobs
    total += 2 * args.jobs if args.behind_api else 0
    cluster = f"{max(MIN_NODES, -(-total * 11 // 80))}x8:16:8"
    print(f"before: {load()}")
    async with pipeline(Path(tmp), cluster, args.api_workers, args.profile) as (
        settings,
        api_url,
        token,
    ):
        api = Connection(api_url, token)
        connections = [Connection(api_url, token) for _ in range(args.clients)]
        try:
            status, body = await api.post(
                "/v1/teams", {"name": "bench", "guaranteed_gpus": 0, "max_gpus": None}
            )
            assert status == 201, body
            stop = asyncio.Event()
            watcher = ReservationWatcher(settings)
            watching = asyncio.create_task(watcher.run(stop))
            await submit(api, -1)  # warm every stage up (connections, topics, caches)
            await asyncio.sleep(2)
            print(f"{args.api_workers} API workers; {load()}")
            stack = stack_roots(settings)
            samples = await latency(api, watcher, args.latency_jobs)
            inside = await recorded_latencies(settings, args.latency_jobs + 1)
            print(f"submit-to-reserved on an idle cluster ({cluster}), {len(samples)} jobs:")
            print(
                f"  client (POST sent → GangReserved seen): p50 {percentile(samples, 0.5):.1f}"
                f" ms, p99 {percentile(samples, 0.99):.1f} ms, "
                f"mean {statistics.fmean(samples):.1f} ms"
            )
            for key, what in (
                ("total_ms", "in the log, JobSubmitted → GangReserved"),
                ("admit_ms", "  of which JobSubmitted → JobAdmitted (relay, Kafka, admission)"),
                ("reserve_ms", "  and JobAdmitted → GangReserved (scheduler)"),
            ):
                values = inside[key]
                print(
                    f"  {what}: p50 {percentile(values, 0.5):.1f} ms, "
                    f"p99 {percentile(values, 0.99):.1f} ms"
                )
            verdict = "met" if percentile(samples, 0.99) < 50 else "MISSED"
            print(f"  target p99 < 50 ms: {verdict}")
            offset = args.latency_jobs
            if args.jobs:
                cpu_before = service_cpu_s(Path(tmp), stack)
                phase_start = watcher.position
                with profiled(Path(tmp), args.profile, "singles"):
                    submit_rate, pipeline_rate = await throughput(
                        connections, watcher, args.jobs, offset=offset
                    )
                cpu_after = service_cpu_s(Path(tmp), stack)
                print(f"single submissions, {args.jobs} jobs from {args.clients} clients:")
                print(f"  API accepted {submit_rate:,.0f} jobs/s")
                print(f"  whole pipeline (to GangReserved): {pipeline_rate:,.0f} jobs/s")
                print(cpu_line(cpu_before, cpu_after, args.jobs))
                print(await stage_timeline(settings, phase_start))
                verdict = "met" if pipeline_rate >= 1000 else "MISSED"
                print(f"  target >= 1,000 jobs/s: {verdict}; {load()}")
                offset += args.jobs
            if args.batch_jobs:
                cpu_before = service_cpu_s(Path(tmp), stack)
                phase_start = watcher.position
                with profiled(Path(tmp), args.profile, "batches"):
                    submit_rate, pipeline_rate = await batched(
                        connections[: args.batch_clients],
                        watcher,
                        args.batch_jobs,
                        offset=offset,
                        batch_size=args.batch_size,
                    )
                cpu_after = service_cpu_s(Path(tmp), stack)
                print(
                    f"batches, {args.batch_jobs} jobs in POST /v1/jobs:batch of "
                    f"{args.batch_size} from {args.batch_clients} clients:"
                )
                print(f"  API accepted {submit_rate:,.0f} jobs/s")
                print(f"  whole pipeline (to GangReserved): {pipeline_rate:,.0f} jobs/s")
                print(cpu_line(cpu_before, cpu_after, args.batch_jobs))
                print(await stage_timeline(settings, phase_start))
                verdict = "met" if pipeline_rate >= 5000 else "MISSED"
                print(f"  target >= 5,000 jobs/s: {verdict}; {load()}")
                offset += args.batch_jobs
            if args.behind_api:
                append_rate, behind_api = await injected(
                    settings, watcher, args.jobs, offset=offset
                )
                print(f"behind the API, {args.jobs} JobSubmitted appended in batches of 100:")
                print(f"  appended {append_rate:,.0f} jobs/s")
                print(f"  relay → admission → scheduler (reserved): {behind_api:,.0f} jobs/s")
                _, scheduler_alone = await injected(
                    settings, watcher, args.jobs, offset=offset + args.jobs, admitted=True
                )
                print(
                    f"  scheduler alone (submitted + admitted appended): {scheduler_alone:,.0f}"
                    " jobs/s"
                )
            stop.set()
            await watching
        finally:
            for connection in [api, *connections]:
                await connection.close()
    print(f"after: {load()}")


if __name__ == "__main__":
    asyncio.run(main())
