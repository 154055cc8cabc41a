"""One team's flood against another team's submissions: does the quiet team still get its
unloaded latency? ("one tenant's input never hurts another tenant")

The pipeline of bench_pipeline.py (relay, admission, one scheduler, `--api-workers` API
processes; no agents, so reserved gangs stay reserved) on a cluster large enough that every job
of the run is reserved at once. Two teams, neither with a policy of its own (the
installation's defaults hold both):

1. quiet alone: team `nlp` submits single 1-GPU jobs one at a time (`POST /v1/jobs`, a pause
   of `--pause-ms` between), for `--seconds`;
2. the same while team `cv` floods: `--flood-clients` loops each sending `POST /v1/jobs:batch`
   of `--flood-batch` jobs as fast as answers come (a 429 is waited out as its Retry-After
   says, at most `--max-backoff-s`).

For the quiet team, each phase prints its submissions' latency (POST sent → answer) and, from
the log's recorded times, JobSubmitted → JobAdmitted → GangReserved, at p50 / p95 / p99; and
any refusal it got (there should be none). For the flooding team: jobs accepted per second and
the answers it got by status.

Run: `python bench/bench_tenants.py [--seconds 8 --flood-clients 3 --flood-batch 200]`.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import asyncpg

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_pipeline import (
    Connection,
    load,
    percentile,
    pipeline,
)


def spec(team: str, index: int) -> dict[str, Any]:
    return {"name": f"{team}-{index}", "team": team, "tasks": 1, "gpus_per_task": 1}


class Quiet:
    """Team nlp's singles, one at a time, and what came back."""

    def __init__(self, api: Connection) -> None:
        self.api = api
        self.latency_ms: list[float] = []
        self.ids: list[str] = []
        self.refused: collections.Counter[int] = collections.Counter()
        self.index = 0

    async def run(self, seconds: float, pause_s: float) -> None:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            self.index += 1
            payload = json.dumps(spec("nlp", self.index)).encode()
            sent = time.perf_counter()
            status, _, body = await self.api.send("/v1/jobs", payload)
            took = (time.perf_counter() - sent) * 1000
            if status == 201:
                self.latency_ms.append(took)
                self.ids.append(str(body["id"]))
            else:
                self.refused[status] += 1
            await asyncio.sleep(pause_s)


class Flood:
    """Team cv's batches from several loops, as fast as the API answers."""

    def __init__(self, connections: list[Connection], batch: int, max_backoff_s: float) -> None:
        self.connections = connections
        self.payload = json.dumps({"jobs": [spec("cv", i) for i in range(batch)]}).encode()
        self.batch = batch
        self.max_backoff_s = max_backoff_s
        self.statuses: collections.Counter[int] = collections.Counter()
        self.accepted = 0
        self.problems: collections.Counter[str] = collections.Counter()

    async def loop(self, api: Connection, stop: asyncio.Event) -> None:
        while not stop.is_set():
            status, headers, body = await api.send("/v1/jobs:batch", self.payload)
            self.statuses[status] += 1
            if status == 201:
                self.accepted += len(body["jobs"])
                continue
            self.problems[str(body.get("type", "")).rsplit("/", 1)[-1]] += 1
            wait = min(self.max_backoff_s, float(headers.get("retry-after", "1")))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), wait)

    async def run(self, stop: asyncio.Event) -> float:
        started = time.perf_counter()
        await asyncio.gather(*(self.loop(api, stop) for api in self.connections))
        return self.accepted / (time.perf_counter() - started)


async def stages(dsn: str, ids: list[str], patience_s: float = 300.0) -> dict[str, list[float]]:
    """For each of `ids` (waiting until every one is reserved): JobSubmitted → JobAdmitted,
    JobAdmitted → GangReserved and JobSubmitted → GangReserved, from the log's recorded
    times, in ms."""
    conn = await asyncpg.connect(dsn)
    streams = [f"job-{job_id}" for job_id in ids]
    try:
        deadline = time.perf_counter() + patience_s
        while True:
            reserved = await conn.fetchval(
                "SELECT count(*) FROM events WHERE stream = ANY($1) AND type = 'GangReserved'",
                streams,
            )
            if reserved >= len(ids) or time.perf_counter() > deadline:
                break
            await asyncio.sleep(0.2)
        rows = await conn.fetch(
            """
            SELECT extract(epoch FROM a.recorded_at - s.recorded_at) * 1000 AS admit_ms,
                   extract(epoch FROM r.recorded_at - a.recorded_at) * 1000 AS reserve_ms,
                   extract(epoch FROM r.recorded_at - s.recorded_at) * 1000 AS total_ms
            FROM events s
            JOIN events a ON a.stream = s.stream AND a.type = 'JobAdmitted'
            JOIN events r ON r.stream = s.stream AND r.type = 'GangReserved'
            WHERE s.type = 'JobSubmitted' AND s.stream = ANY($1)
            """,
            streams,
        )
    finally:
        await conn.close()
    return {k: [float(row[k]) for row in rows] for k in ("admit_ms", "reserve_ms", "total_ms")}


def figures(values: list[float]) -> str:
    if not values:
        return "none"
    return (
        f"p50 {percentile(values, 0.5):.1f}, p95 {percentile(values, 0.95):.1f}, "
        f"p99 {percentile(values, 0.99):.1f} ms"
    )


async def report(dsn: str, what: str, quiet: Quiet) -> None:
    inside = await stages(dsn, quiet.ids)
    print(f"{what}: team nlp, {len(quiet.ids)} single submissions")
    print(f"  POST /v1/jobs sent → answered: {figures(quiet.latency_ms)}")
    print(f"  JobSubmitted → GangReserved (log): {figures(inside['total_ms'])}")
    print(f"    of which → JobAdmitted: {figures(inside['admit_ms'])}")
    print(f"    and JobAdmitted → GangReserved: {figures(inside['reserve_ms'])}")
    refused = dict(quiet.refused) or "none"
    print(f"  refused: {refused}; not reserved: {len(quiet.ids) - len(inside['total_ms'])}")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=8.0, help="each phase's length")
    parser.add_argument("--pause-ms", type=float, default=20.0)
    parser.add_argument("--flood-clients", type=int, default=3)
    parser.add_argument("--flood-batch", type=int, default=200)
    parser.add_argument("--max-backoff-s", type=float, default=1.0)
    parser.add_argument("--api-workers", type=int, default=2)
    parser.add_argument("--nodes", type=int, default=6000, help="8-GPU nodes in the cluster")
    parser.add_argument(
        "--state-dir", help="keep the services' logs and pid files here (default: a temporary one)"
    )
    args = parser.parse_args()
    print(f"before: {load()}")
    with contextlib.ExitStack() as scope:
        tmp = args.state_dir or scope.enter_context(
            tempfile.TemporaryDirectory(prefix="gangway-bench-")
        )
        cluster = f"{args.nodes}x8:16:8"
        async with pipeline(Path(tmp), cluster, args.api_workers) as (settings, url, admin):
            await _bench(args, settings.pg_dsn, url, admin)
    print(f"after: {load()}")


async def _bench(args: argparse.Namespace, dsn: str, url: str, admin: str) -> None:
    setup = Connection(url, admin)
    tokens = {}
    for team in ("nlp", "cv"):
        payload = json.dumps({"name": team, "guaranteed_gpus": 0, "max_gpus": None}).encode()
        status, _, body = await setup.send("/v1/teams", payload)
        assert status == 201, body
        tokens[team] = str(body["token"])
    await setup.close()
    quiet_api = Connection(url, tokens["nlp"])
    warm = Flood([Connection(url, tokens["cv"])], args.flood_batch, args.max_backoff_s)
    await Quiet(quiet_api).run(0.5, args.pause_ms / 1000)
    status, _, _ = await warm.connections[0].send("/v1/jobs:batch", warm.payload)
    assert status == 201, status
    await asyncio.sleep(2)
    print(f"{args.api_workers} API workers, cluster {args.nodes}x8; {load()}")

    alone = Quiet(quiet_api)
    await alone.run(args.seconds, args.pause_ms / 1000)
    await report(dsn, "alone", alone)

    await asyncio.sleep(2)
    flood = Flood(
        [Connection(url, tokens["cv"]) for _ in range(args.flood_clients)],
        args.flood_batch,
        args.max_backoff_s,
    )
    stop = asyncio.Event()
    flooding = asyncio.create_task(flood.run(stop))
    await asyncio.sleep(1.0)  # the flood under way
    loaded = Quiet(quiet_api)
    loaded.index = alone.index
    await loaded.run(args.seconds, args.pause_ms / 1000)
    stop.set()
    rate = await flooding
    await report(dsn, f"while cv floods ({args.flood_clients} loops of {args.flood_batch})", loaded)
    print(
        f"team cv: accepted {rate:,.0f} jobs/s; answers {dict(flood.statuses)}"
        + (f", problems {dict(flood.problems)}" if flood.problems else "")
    )
    print(f"  {load()}")
    for api in (quiet_api, *flood.connections, *warm.connections):
        await api.close()


if __name__ == "__main__":
    asyncio.run(main())
