"""Wires the agents from settings: discovery, store, metrics, reconcile, consumer, heartbeats."""

from __future__ import annotations

import asyncio
import logging

from services.agent.agent import Agent
from services.agent.heartbeats import NvmlSampler
from services.agent.log_server import LogServer, create_app
from services.agent.nic import FabricLinks
from services.agent.settings import AgentSettings
from services.runtime.consumer import wait_started
from services.runtime.discovery import discover, import_nvml
from services.runtime.metrics import ConsumerLag, start_metrics_server
from services.runtime.startup import open_store

log = logging.getLogger("services.agent")


async def run(settings: AgentSettings, stop: asyncio.Event) -> None:
    nodes = discover(
        settings.cluster,
        mode=settings.discovery,
        node_id=settings.node_id,
        rack=settings.node_rack,
        block=settings.node_block,
    )
    sampler = None
    if nodes and nodes[0].discovered_by == "nvml":
        sampler = NvmlSampler(import_nvml(), links=FabricLinks())
    server = LogServer(settings.log_host, settings.log_port)
    # Started while the database is away (a supervisor's restart during an outage): wait.
    store = await open_store(settings, producer="agent", log=log, stop=stop)
    if store is None:
        return
    agent = Agent(settings, store, nodes, sampler=sampler)
    try:
        await server.start(
            create_app(agent.work_dir, settings.bus_signing_key, agent.attempt_running)
        )
        if settings.metrics_port is not None:
            start_metrics_server(settings.metrics_port, agent.registry)
        recovered = await agent.reconcile()
        if recovered:
            log.warning("%d ranks of a previous agent stopped and recorded", recovered)
        consumer = agent.consumer()
        ConsumerLag("agent", agent.registry).watch("events", consumer)
        consume = asyncio.create_task(consumer.run(stop))
        beat = asyncio.create_task(agent.heartbeat_loop(stop))
        await wait_started(consumer, consume)
        log.info("%d nodes (%s); agent ready", len(nodes), settings.cluster)
        retire = asyncio.create_task(agent.retention_loop(stop))
        disks = asyncio.create_task(agent.disk_loop(stop))
        await asyncio.gather(consume, beat, retire, disks)
    finally:
        await server.stop()
        await agent.shutdown()
        await store.close()
