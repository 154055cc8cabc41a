"""Heartbeats at the design scale: 100,000 GPUs (12,500 nodes of 8), 2,500 heartbeats/s.

Measures, against the real Kafka: how fast the agent publishes a round of heartbeats for the
whole fleet (one batch per round, as `python -m services.agent` does), and how fast the
inventory's and the health service's telemetry consumers (the shared TelemetryConsumer with
their real handlers) take them in. Target: both sides well above 2,500 heartbeats/s.
Run: `python bench/bench_fleet.py [--nodes 12500] [--rounds 3]` with the stack up (`make up`).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from scratch import scratch_settings

from schemas.telemetry import NodeHeartbeat, StepTimeSample
from services.agent.agent import Agent
from services.agent.settings import AgentSettings
from services.health.service import HealthService
from services.health.settings import HealthSettings
from services.inventory.service import Inventory
from services.inventory.settings import InventorySettings
from services.runtime import EventStore
from services.runtime.consumer import TelemetryConsumer, TelemetryHandler, wait_started
from services.runtime.discovery import load_cluster_spec
from services.runtime.kafka import make_producer

TARGET_PER_S = 2_500


async def main(nodes: int, rounds: int) -> None:
    fleet = load_cluster_spec(f"{nodes}x8:16:4")
    async with scratch_settings() as settings:
        base = settings.model_dump()
        store = await EventStore.connect(settings, producer="bench")
        try:
            inventory = Inventory(InventorySettings(**base, _env_file=None), store)
            await inventory.register(fleet)
            health = HealthService(HealthSettings(**base, _env_file=None), store)
            agent = Agent(
                AgentSettings(**base, fault_dir=Path("/nonexistent"), _env_file=None),
                store,
                fleet,
            )
            total = nodes * rounds
            counts = {"inventory": 0, "health": 0}
            done = {name: asyncio.Event() for name in counts}

            def counting(name: str, handler: TelemetryHandler) -> TelemetryHandler:
                async def handle(message: NodeHeartbeat | StepTimeSample) -> None:
                    await handler(message)
                    counts[name] += 1
                    if counts[name] >= total:
                        done[name].set()

                return handle

            stop = asyncio.Event()
            consumers = [
                TelemetryConsumer(settings, name=f"bench-{name}", handler=counting(name, handler))
                for name, handler in (
                    ("inventory", inventory.on_telemetry),
                    ("health", health.on_telemetry),
                )
            ]
            tasks = [asyncio.create_task(c.run(stop)) for c in consumers]
            for consumer, task in zip(consumers, tasks, strict=True):
                await wait_started(consumer, task)

            producer = make_producer(settings, client_id="bench-agent")
            await producer.start()
            started = time.perf_counter()
            round_times = []
            for _ in range(rounds):
                begin = time.perf_counter()
                await agent.send_heartbeats(producer)
                round_times.append(time.perf_counter() - begin)
            await producer.stop()
            await asyncio.wait_for(asyncio.gather(*(event.wait() for event in done.values())), 600)
            consumed_s = time.perf_counter() - started
            stop.set()
            await asyncio.gather(*tasks)
        finally:
            await store.close()

    best = min(round_times)
    print(f"fleet: {nodes} nodes, {nodes * 8} GPUs, {rounds} rounds of heartbeats")
    print(
        f"agent publish: best round {best:.2f} s = {nodes / best:,.0f} heartbeats/s "
        f"(target {TARGET_PER_S:,}/s)"
    )
    print(
        f"inventory + health consume: {total:,} heartbeats each in {consumed_s:.2f} s = "
        f"{total / consumed_s:,.0f} heartbeats/s per service (target {TARGET_PER_S:,}/s)"
    )
    lost = len(inventory.liveness.lost)
    print(f"nodes considered lost afterwards: {lost}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=12_500)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    asyncio.run(main(args.nodes, args.rounds))
