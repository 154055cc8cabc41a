"""The agent of one node or of a simulated fleet: heartbeats and the ranks of its gangs.

One process serves every node it was given (one for a real host, the whole spec for the
simulated fleet): one heartbeat loop that batches all nodes' heartbeats per round, and one
consumer of job and checkpoint events that starts, checkpoints and stops the ranks placed on
those nodes. Rank exits are recorded as TaskExited as they happen.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import json
import logging
import os
import shutil
import signal
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import asyncpg
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError
from prometheus_client import Counter, Gauge

from schemas.checkpoints import (
    CheckpointCommitted,
    CheckpointCorrupted,
    CheckpointFailed,
    CheckpointRequested,
)
from schemas.envelope import EventEnvelope
from schemas.jobs import (
    GANG_RELEASING_EVENTS,
    GangReserved,
    JobSpec,
    PreemptionRequested,
    RankPlacement,
    TaskExited,
    TaskStarted,
    illegal_env_names,
)
from schemas.nodes import NodeRegistered
from schemas.reasons import AGENT_RESTARTED
from schemas.telemetry import StepTimeSample
from services.agent import isolation, logs
from services.agent.devices import mig_slot, mps_share
from services.agent.disk import (
    DISK_LIMIT_REASON,
    SIGXFSZ_EXIT_CODES,
    DiskLimit,
    DiskUse,
    disk_limit,
    disk_use,
    file_size_reason,
    held_deleted,
    over_limit_reason,
    processes_of,
)
from services.agent.exits import OOM_REASON, killed_for_memory, oom_kill_count
from services.agent.faults import HEALTHY, Fault, FaultReader
from services.agent.heartbeats import NvmlSampler, synthetic_heartbeat
from services.agent.mps import MPS_CONTROL, MpsDaemons, mps_mode
from services.agent.plan import (
    CHECKPOINT_SIGNAL_ENV,
    AgentJob,
    committed_newest_first,
    fold_job,
    launch_failure,
    rank_env,
    ranks_to_launch,
)
from services.agent.ranks import (
    MasterPorts,
    RankKey,
    RankProcess,
    derived_master_port,
    distributed_env,
    group_members,
    infrastructure_ports,
    kill_until_gone,
    launch,
    node_address,
    stop_orphan,
    unrecorded_ranks,
)
from services.agent.secrets import resolve_secret_env
from services.agent.settings import AgentSettings
from services.agent.steps import STEP_FILE, read_new_steps
from services.runtime.checkpoint_store import (
    REQUEST,
    checkpoint_dir,
    checkpoint_id_for,
    record_failure,
    record_shard,
    shard_path,
    verify_committed,
    write_request,
    write_shard,
)
from services.runtime.consumer import EventConsumer, EventHandler, telemetry_record
from services.runtime.errors import DATABASE_UNAVAILABLE, DomainError
from services.runtime.kafka import make_producer, start_producer, stop_producer
from services.runtime.metrics import new_registry
from services.runtime.mig_discovery import NvmlMigGpu, mig_instance_ids, mig_uuids, read_mig
from services.runtime.records import Metadata
from services.runtime.retry import Outage, until_available
from services.runtime.store import EventStore
from services.runtime.topics import Topics

log = logging.getLogger(__name__)

LAUNCH_FAILED_EXIT_CODE = 127
# How often a launch waiting for its GPUs (`_gpus_free`) looks again.
GPU_FREE_POLL_S = 0.05

T = TypeVar("T")


@dataclass(eq=False)
class Launch:
    """An attempt whose ranks the agent is starting; `stopped` says why it must start no more
    (and `released` wakes a launch waiting for the log)."""

    job_id: str
    attempt: int
    stopped: str | None = None
    released: asyncio.Event = field(default_factory=asyncio.Event)
    # Set once the launch is over (its ranks started, or not): a preemption that came
    # meanwhile waits for it.
    over: asyncio.Event = field(default_factory=asyncio.Event)

    def stop(self, reason: str) -> None:
        self.stopped = self.stopped or reason
        self.released.set()


class _Released(Exception):
    """The attempt was released while its launch waited for the log: start no more ranks."""


class Agent:
    def __init__(
        self,
        settings: AgentSettings,
        store: EventStore,
        nodes: Sequence[NodeRegistered],
        *,
        sampler: NvmlSampler | None = None,
    ) -> None:
        self.settings = settings
        self.store = store
        self.nodes = {node.node_id: node for node in nodes}
        self.sampler = sampler
        self.topics = Topics.from_settings(settings)
        self.faults = FaultReader(settings.fault_dir)
        self.ranks: dict[RankKey, RankProcess] = {}
        self.launched: set[tuple[str, int, int]] = set()
        self._tasks: set[asyncio.Task[Any]] = set()
        # The attempts whose ranks are being started, and the tasks starting them.
        self._launches: set[Launch] = set()
        self._launch_tasks: set[asyncio.Task[None]] = set()
        # What the background work (launches, recorded starts and exits) sees of the log:
        # one line when it is lost, one when it is back, the retries in between counted.
        self.log_outage = Outage(log, "agent: the event log")
        # Set by `shutdown`: a record still waiting for the log is then left to the next
        # agent's reconcile, which recovers it (`reconcile`), instead of holding the exit.
        self._stopping = asyncio.Event()
        self._cgroups: dict[RankKey, str] = {}
        # The kernel's OOM-kill count (the rank's cgroup's, else the host's) at each launch.
        self._oom_kills: dict[RankKey, int] = {}
        self.master_ports = MasterPorts(
            avoid=infrastructure_ports(settings.pg_dsn, settings.kafka_bootstrap, settings.api_url)
            | {port for port in (settings.metrics_port, settings.log_port) if port}
        )
        self._addresses = {node_id: node_address(node) for node_id, node in self.nodes.items()}
        self.root_dir = settings.checkpoint_root.resolve()
        self.work_dir = settings.work_dir.resolve()
        # Agents of several stacks on one host (simulated fleets, tests) may run jobs of one
        # id: each names its ranks' cgroups apart, since what is in one is killed at its end.
        self._cgroup_tag = hashlib.sha256(str(self.work_dir).encode()).hexdigest()[:8]
        self.isolating = isolation.isolating(settings.rank_isolation)
        self.state_dir = isolation.state_dir_of(self.work_dir, self.root_dir)
        if self.isolating:
            isolation.hide_state(self.state_dir, self.work_dir, self.root_dir)
        # A real node's MPS shares each reach their own GPU's daemon (services/agent/mps.py),
        # or the operator's one (`host`); the GPU (UUID) whose daemon each rank holds.
        self.mps: MpsDaemons | None = None
        self._mps_held: dict[RankKey, str] = {}
        real = any(node.discovered_by == "nvml" for node in nodes)
        control = shutil.which(MPS_CONTROL)
        if real and mps_mode(settings.mps_daemon, control) == "per-gpu":
            state = self.state_dir or self.work_dir.parent
            self.mps = MpsDaemons(
                (settings.mps_dir or state / "mps").resolve(),
                control=control or MPS_CONTROL,
                timeout_s=settings.mps_control_timeout_s,
            )
            self.mps.prepare()
            if self.isolating:  # a share's user reaches its GPU's pipes, unsandboxed too
                isolation.make_traversable(self.mps.root)
        registry = new_registry()
        self.registry = registry
        self.heartbeats_sent = Counter(
            "gangway_agent_heartbeats", "Heartbeats published", registry=registry
        )
        self.ranks_started = Counter(
            "gangway_agent_ranks_started", "Ranks launched", registry=registry
        )
        self.ranks_running = Gauge(
            "gangway_agent_ranks_running", "Ranks running now", registry=registry
        )

    # ------------------------------------------------------------------ wiring

    def handlers(self) -> dict[str, EventHandler]:
        handlers: dict[str, EventHandler] = {
            GangReserved.type: self.on_gang_reserved,
            PreemptionRequested.type: self.on_preemption_requested,
            CheckpointRequested.type: self.on_checkpoint_requested,
        }
        for event_type in GANG_RELEASING_EVENTS:
            handlers[event_type.type] = self.on_gang_released
        return handlers

    def consumer(self) -> EventConsumer:
        name = self.settings.consumer_group or self.default_group()
        return EventConsumer(
            self.settings,
            self.store.pool,
            name=name,
            topics=[self.topics.jobs, self.topics.checkpoints],
            handlers=self.handlers(),
        )

    def default_group(self) -> str:
        """One consumer group per agent process: every agent must see every gang."""
        ids = sorted(self.nodes)
        if len(ids) == 1:
            return f"agent-{ids[0]}"
        return f"agent-{ids[0]}-{ids[-1]}-{len(ids)}"

    def _spawn(self, coroutine: Any) -> None:
        task = asyncio.create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(_log_failure)

    # ------------------------------------------------------------------ heartbeats

    def busy_gpus(self) -> dict[str, set[int]]:
        busy: dict[str, set[int]] = {}
        for rank in self.ranks.values():
            if rank.on_gpus:
                busy.setdefault(rank.placement.node_id, set()).update(rank.placement.gpus)
        return busy

    async def send_heartbeats(self, producer: AIOKafkaProducer) -> int:
        """One round: a heartbeat per node that is not silenced, sent as one batch."""
        faults = self.faults.current()
        now = datetime.now(UTC)
        busy = self.busy_gpus()
        pending = []
        for node_id, node in self.nodes.items():
            fault = faults.get(node_id, HEALTHY)
            if fault.silent:
                continue
            if self.sampler is not None:
                heartbeat = self.sampler.heartbeat(node_id, now, fault)
            else:
                heartbeat = synthetic_heartbeat(node, now, fault, busy.get(node_id))
            value, headers = telemetry_record(heartbeat, self.settings.bus_signing_key)
            pending.append(
                await producer.send(
                    self.topics.telemetry, value, key=node_id.encode(), headers=headers
                )
            )
        heartbeats = len(pending)
        for sample in await asyncio.to_thread(self.collect_steps, now, faults):
            value, headers = telemetry_record(sample, self.settings.bus_signing_key)
            pending.append(
                await producer.send(
                    self.topics.telemetry, value, key=sample.node_id.encode(), headers=headers
                )
            )
        await asyncio.gather(*pending)
        self.heartbeats_sent.inc(heartbeats)
        return heartbeats

    def collect_steps(self, now: datetime, faults: dict[str, Fault]) -> list[StepTimeSample]:
        """The step times the running ranks reported since the last round (a silenced node's
        ranks are silent too)."""
        samples = []
        for rank in list(self.ranks.values()):
            node_id = rank.placement.node_id
            if not rank.running or faults.get(node_id, HEALTHY).silent:
                continue
            steps, rank.step_offset = read_new_steps(rank.workdir / STEP_FILE, rank.step_offset)
            samples += [
                StepTimeSample(
                    job_id=rank.key.job_id,
                    attempt=rank.key.attempt,
                    rank=rank.key.rank,
                    node_id=node_id,
                    step=step,
                    step_time_s=seconds,
                    at=now,
                )
                for step, seconds in steps
            ]
        return samples

    async def heartbeat_loop(self, stop: asyncio.Event) -> None:
        # Started by the first round, and again by the round after one that failed.
        producer: AIOKafkaProducer | None = None
        # A broker away (stopped, restarting) is an outage, said once, now and then, and when
        # it is over: a traceback every round filled the log while it was away.
        bus = Outage(log, "agent: the bus (heartbeats)")
        try:
            interval = self.settings.heartbeat_interval_s
            next_round = time.monotonic()
            while not stop.is_set():
                try:
                    if producer is None:
                        producer = await self._heartbeat_producer()
                    await self.send_heartbeats(producer)
                    bus.recovered()
                except Exception as error:
                    # A broker hiccup costs a round, not the agent; inventory tolerates gaps.
                    if isinstance(error, KafkaError | TimeoutError):
                        bus.failed(error)
                    else:
                        log.exception("heartbeat round failed")
                    # An idempotent producer whose batch failed may hold a broken sequence:
                    # after a broker restart that lost its log's tail, the broker refused every
                    # later batch of some partitions (OutOfOrderSequenceNumber), and those
                    # nodes were declared lost for good. The next round starts afresh.
                    await stop_producer(producer)
                    producer = None
                next_round += interval
                delay = max(0.0, next_round - time.monotonic())
                if delay == 0.0:
                    next_round = time.monotonic()  # fell behind: do not burst to catch up
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), delay)
        finally:
            await stop_producer(producer)

    async def _heartbeat_producer(self) -> AIOKafkaProducer:
        """A fresh heartbeat producer; while the broker is away its start fails, bounded, and
        the round with it."""
        return await start_producer(
            make_producer(self.settings, client_id=f"{self.settings.service_name}-hb")
        )

    # ------------------------------------------------------------------ gangs

    async def on_gang_reserved(self, envelope: EventEnvelope, conn: asyncpg.Connection) -> None:
        """Decide which ranks are this agent's and start launching them in the background.

        The consumer hands the agent one event at a time: a gang of 4,096 ranks launched
        inside the handler held back every later event (other jobs' gangs, the gang's own
        cancel) for minutes. The ranks are marked launched here, so a redelivery starts none
        twice. The event is consumed before its ranks start: after a crash mid-launch the
        restarted agent's reconcile stops the ranks that did start (their attempt ends) and
        starts the gangs of which none had (`_resume_launches`)."""
        await self._start_gang(envelope)

    async def _start_gang(self, envelope: EventEnvelope) -> None:
        reserved = envelope.payload
        assert isinstance(reserved, GangReserved)
        if not any(r.node_id in self.nodes for r in reserved.ranks):
            return
        view = fold_job(e.payload for e in await self.store.read_stream(reserved.stream))
        todo = ranks_to_launch(view, reserved, self.nodes, self.launched)
        if not todo:
            return
        if view.spec is None:
            # Dead-lettered with this reason: a gang of a job the log never saw submitted.
            raise DomainError(f"job {reserved.job_id} has no JobSubmitted; nothing to launch")
        for placement in todo:
            self.launched.add((reserved.job_id, reserved.attempt, placement.rank))
        starting = Launch(reserved.job_id, reserved.attempt)
        self._launches.add(starting)
        task = asyncio.create_task(
            self._launch_ranks(starting, reserved, view, todo, Metadata.caused_by(envelope))
        )
        self._launch_tasks.add(task)
        task.add_done_callback(self._launch_tasks.discard)
        task.add_done_callback(lambda _: self._launches.discard(starting))
        task.add_done_callback(lambda _: starting.over.set())
        task.add_done_callback(_log_failure)

    async def launches_done(self) -> None:
        """Wait until every launch under way has started (or failed to start) its ranks."""
        while self._launch_tasks:
            await asyncio.gather(*self._launch_tasks, return_exceptions=True)

    async def _launch_ranks(
        self,
        starting: Launch,
        reserved: GangReserved,
        view: AgentJob,
        todo: list[RankPlacement],
        meta: Metadata,
    ) -> None:
        """Start the ranks one by one, and none once the attempt is released (cancelled,
        preempted, failed): a released attempt's ranks still to start never start.

        The ranks are marked launched, so no redelivery starts them: a launch waits out an
        outage of the log (`_from_log`) rather than die with its ranks marked and never started
        (the gang held its GPUs with no rank until the launch timeout). Should it fail for any
        other reason, the ranks it had not yet tried are unmarked, so the gang's redelivery
        starts them; a rank it tried stays marked, as it may have started."""
        left = list(todo)
        try:
            await self._start_ranks(starting, reserved, view, left, meta)
        except _Released:
            pass
        except Exception:
            log.exception(
                "%s/%d: launch failed; %d ranks left for a redelivery",
                reserved.job_id,
                reserved.attempt,
                len(left),
            )
            for placement in left:
                self.launched.discard((reserved.job_id, reserved.attempt, placement.rank))
            return
        if left:
            log.info(
                "%s/%d released (%s): %d ranks left unstarted",
                starting.job_id,
                starting.attempt,
                starting.stopped,
                len(left),
            )

    async def _start_ranks(
        self,
        starting: Launch,
        reserved: GangReserved,
        view: AgentJob,
        left: list[RankPlacement],
        meta: Metadata,
    ) -> None:
        """`_launch_ranks`' work; takes each rank off `left` as it tries it."""
        spec = view.spec
        assert spec is not None
        resume = await self.usable_checkpoint(starting, meta)
        world_size = len(reserved.ranks)
        while left and starting.stopped is None:
            placement = left.pop(0)
            rank = await self._launch_rank(
                starting, reserved, view, spec, placement, world_size, resume, meta
            )
            if rank is not None and starting.stopped is not None:
                # Released while this rank was starting: the release found it not yet listed.
                self._spawn(rank.stop(starting.stopped, self.settings.stop_timeout_s))

    async def _from_log(self, starting: Launch, read: Callable[[], Awaitable[T]]) -> T:
        """`read()` until the log answers; raises _Released once the attempt is released."""
        result = await until_available(
            read, self.log_outage, starting.released, transient=DATABASE_UNAVAILABLE
        )
        if starting.released.is_set():
            raise _Released
        return result  # type: ignore[return-value]  # None only when released

    async def _launch_rank(
        self,
        starting: Launch,
        reserved: GangReserved,
        view: AgentJob,
        spec: JobSpec,
        placement: RankPlacement,
        world_size: int,
        resume: Path | None,
        meta: Metadata,
    ) -> RankProcess | None:
        key = RankKey(reserved.job_id, reserved.attempt, placement.rank)
        workdir = self.work_dir / key.job_id / f"a{key.attempt}" / f"rank-{key.rank}"
        started = TaskStarted(
            job_id=key.job_id, attempt=key.attempt, rank=key.rank, node_id=placement.node_id
        )
        cgroup_name = self.cgroup_name(key)
        try:
            node = self.nodes[placement.node_id]
            # A real node's GPUs go by their UUIDs (services/agent/devices.py); a slice's MIG
            # device UUID is read from NVML at launch, as the instance is now.
            gpu_uuids = (
                {g.index: g.uuid for g in node.gpus} if node.discovered_by == "nvml" else None
            )
            slot = mig_slot(spec, placement)
            listing = (
                await asyncio.to_thread(self._mig_listing, slot[0])
                if gpu_uuids is not None and slot is not None
                else None
            )
            env = rank_env(
                spec=spec,
                job_id=key.job_id,
                attempt=key.attempt,
                placement=placement,
                world_size=world_size,
                checkpoint_dir=resume,
                checkpoint_request=workdir / REQUEST,
                step_file=workdir / STEP_FILE,
                agent_env=os.environ,
                gpu_memory_mb={g.index: g.memory_mb for g in node.gpus},
                mig_uuids=None if listing is None else mig_uuids([listing]),
                gpu_uuids=gpu_uuids,
                checkpoint_interval_s=reserved.checkpoint_interval_s,
            )
            if view.array_index is not None:
                env["GANGWAY_ARRAY_INDEX"] = str(view.array_index)
            bad_names = illegal_env_names(spec.env)
            if bad_names:
                raise ValueError(f"illegal environment variable name {bad_names[0]!r}")
            env.update(await self._from_log(starting, lambda: resolve_secret_env(self.store, spec)))
            master_addr, master_port = await self._master(starting, reserved)
            env.update(distributed_env(reserved.ranks, key.rank, master_addr, master_port))
            gpus = [] if gpu_uuids is None else [gpu_uuids[gpu] for gpu in placement.gpus]
            mps = mps_share(spec, placement)
            pipe = await self._mps_pipe(key, spec, gpus, env) if mps else None
            sandbox = await asyncio.to_thread(
                self._sandbox,
                spec,
                list(spec.command),
                env,
                workdir,
                cgroup_name,
                gpus,
                mps,
                listing is not None,
                None if slot is None or listing is None else mig_instance_ids(listing, slot[1]),
                pipe,
            )
            cgroup = cgroup_name if sandbox is not None and sandbox.cgroup_procs else None
            # Counted before the start, so an OOM kill at the very start is seen too.
            oom_kills = await asyncio.to_thread(oom_kill_count, cgroup)
            settings = self.settings
            limit = disk_limit(
                spec,
                settings.rank_disk_mb,
                settings.rank_disk_max_mb,
                settings.rank_disk_max_entries,
            )
            await self._gpus_free(starting, key, placement)
            rank = await launch(
                key, placement, world_size, list(spec.command), env, workdir, sandbox, limit
            )
        except _Released:
            await self._release_mps(key)
            raise
        except Exception as error:
            await self._release_mps(key)
            # Any failure to start ends the attempt with a reason a person understands;
            # the core's retry policy decides what comes next. A rank marked launched but
            # never recorded would hold the gang's GPUs with no process at all.
            reason, permanent = launch_failure(placement.node_id, key.rank, error)
            log.warning("rank %s could not start: %s", key, reason)
            exited = TaskExited(
                job_id=key.job_id,
                attempt=key.attempt,
                rank=key.rank,
                node_id=placement.node_id,
                exit_code=LAUNCH_FAILED_EXIT_CODE,
                reason=reason,
                permanent=permanent,
            )
            # Left unrecorded only by a shutdown in an outage: with no rank of the gang in
            # the log as started, the next agent's reconcile starts the gang again
            # (`_resume_launches`), and the failure is recorded then.
            await self._append_until_recorded(reserved.stream, [started, exited], meta)
            self._release_port_if_done(key)
            return None
        rank.checkpoints_itself = CHECKPOINT_SIGNAL_ENV in spec.env
        if cgroup is not None:
            self._cgroups[key] = cgroup
        self._oom_kills[key] = oom_kills
        # Recorded before the exit watcher starts, so TaskStarted always precedes
        # TaskExited in the log.
        if not await self._record(started, meta):
            # The agent stops while the log is away: a rank the log never saw started is
            # stopped unrecorded, and the next agent's reconcile starts its gang again.
            await rank.stop("agent stopped", self.settings.stop_timeout_s)
            await self._release_mps(key)
            self._release_port_if_done(key)
            return None
        self.ranks[key] = rank
        self.ranks_started.inc()
        self.ranks_running.inc()
        log.info(
            "started %s on %s gpus %s (pid %d)", key, placement.node_id, placement.gpus, rank.pid
        )
        self._spawn(self._watch(rank, meta))
        return rank

    async def _gpus_free(self, starting: Launch, key: RankKey, placement: RankPlacement) -> None:
        """Wait until no other rank of this agent runs on the whole GPUs `placement` gives
        this one; raises _Released once the attempt is released meanwhile.

        The scheduler decides on the log as it had folded it, and its append checks only the
        streams it writes: a rank started just after its gang was released (a late
        TaskStarted on that job's stream) did not stop a cycle decided before it from giving
        its GPUs to another gang, and two ranks ran on one GPU for the first one's stop time.
        Shared GPUs (MIG slices, fractions) host several ranks by design."""
        if placement.mig is not None or placement.share is not None or not placement.gpus:
            return  # a CPU-only rank (a gang of thousands) looks at no other rank
        wanted = set(placement.gpus)
        waited = False
        while any(
            other.on_gpus
            and other.key != key
            and other.placement.node_id == placement.node_id
            and other.placement.mig is None
            and other.placement.share is None
            and wanted.intersection(other.placement.gpus)
            for other in self.ranks.values()
        ):
            if starting.released.is_set():
                raise _Released
            if not waited:
                log.warning(
                    "%s waits for GPUs %s of %s: a rank still runs on them",
                    key,
                    sorted(wanted),
                    placement.node_id,
                )
                waited = True
            await asyncio.sleep(GPU_FREE_POLL_S)

    async def _master(self, starting: Launch, reserved: GangReserved) -> tuple[str, int]:
        """MASTER_ADDR and MASTER_PORT of the attempt: rank 0's node, and the port every agent
        derives (reserved and checked by rank 0's agent: services/agent/ranks.py)."""
        first = min(reserved.ranks, key=lambda placement: placement.rank)
        if first.node_id not in self.nodes:
            port = derived_master_port(reserved.job_id, reserved.attempt, self.master_ports.avoid)
            return await self._from_log(starting, lambda: self._address_of(first.node_id)), port
        whole_gang = all(placement.node_id in self.nodes for placement in reserved.ranks)
        port = self.master_ports.reserve(reserved.job_id, reserved.attempt, whole_gang=whole_gang)
        return self._addresses[first.node_id], port

    async def _address_of(self, node_id: str) -> str:
        """Another agent's node's address, as its registration in the log gives it."""
        if node_id not in self._addresses:
            stream = await self.store.read_stream(f"node-{node_id}")
            registered = [e.payload for e in stream if isinstance(e.payload, NodeRegistered)]
            if not registered:
                raise LookupError(f"rank 0's node {node_id} never registered")
            self._addresses[node_id] = node_address(registered[-1])
        return self._addresses[node_id]

    async def _mps_pipe(
        self, key: RankKey, spec: JobSpec, gpus: Sequence[str], env: dict[str, str]
    ) -> Path | None:
        """An MPS share's own GPU's daemon, started if none runs (services/agent/mps.py): its
        pipe directory, set as the rank's CUDA_MPS_PIPE_DIRECTORY, sandboxed or not. None on a
        simulated node, or where the operator's host daemon serves the shares (`host`).
        Raises MpsDaemonError (a transient launch failure) when the daemon does not come up."""
        if self.mps is None or not gpus:
            return None
        owner = None
        if self.isolating:
            user = await asyncio.to_thread(isolation.team_user, spec.team)
            owner = (user.uid, user.gid)
        pipe = await self.mps.acquire(gpus[0], key, owner)
        self._mps_held[key] = gpus[0]
        env["CUDA_MPS_PIPE_DIRECTORY"] = str(pipe)
        return pipe

    async def _release_mps(self, key: RankKey) -> None:
        """The rank no longer uses its GPU's daemon, which is quit if it served no other."""
        uuid = self._mps_held.pop(key, None)
        if uuid is not None and self.mps is not None:
            await self.mps.release(uuid, key)

    def cgroup_name(self, key: RankKey) -> str:
        return f"{key.job_id}-a{key.attempt}-r{key.rank}.{self._cgroup_tag}"

    def _release_port_if_done(self, key: RankKey) -> None:
        """The attempt's MASTER_PORT is free again once none of its ranks runs here."""
        if not self._running(key.job_id, key.attempt):
            self.master_ports.release(key.job_id, key.attempt)

    def _sandbox(
        self,
        spec: JobSpec,
        argv: list[str],
        env: dict[str, str],
        workdir: Path,
        cgroup_name: str,
        gpus: Sequence[str] = (),
        mps: bool = False,
        slice_rank: bool = False,
        mig: tuple[int, int] | None = None,
        mps_pipe: Path | None = None,
    ) -> isolation.Sandbox | None:
        """How the rank starts: as its team's user, in its cgroups and sandbox (isolation.py),
        which holds the device nodes of its real GPUs (`gpus`, by UUID) and of no other, and
        the MPS daemon's pipes only where the ledger placed it as an MPS share (`mps`): its own
        GPU's daemon's (`mps_pipe`) where the agent runs one per GPU, every other GPU's hidden,
        else the host's; and a slice rank's (`mig`: its GPU and compute instance ids) access
        to its slice alone.
        None when the agent does not isolate (it is not root, or told not to). Raises
        IsolationError (the launch fails) rather than start a rank as root."""
        if not self.isolating:
            return None
        user = isolation.team_user(spec.team)
        job_dir = self.work_dir / workdir.relative_to(self.work_dir).parts[0]
        isolation.own_directory(job_dir, user)
        for part in workdir.relative_to(job_dir).parts:
            job_dir = job_dir / part
            isolation.own_directory(job_dir, user)
        checkpoints = self.root_dir / workdir.relative_to(self.work_dir).parts[0]
        isolation.own_directory(checkpoints, user)
        # Up to (not into) the job's own directories, which stay 0700.
        isolation.make_traversable(self.work_dir / workdir.relative_to(self.work_dir).parts[0])
        isolation.make_traversable(checkpoints)
        program = shutil.which(argv[0], path=env.get("PATH")) if argv else None
        if program is None:
            # Inside bwrap the exec would fail only after the sandbox started: fail the launch
            # here, as an unsandboxed exec would.
            raise FileNotFoundError(f"no such program: {argv[0] if argv else '(empty command)'}")
        isolation.make_traversable(Path(program).absolute())
        isolation.make_traversable(Path(program).resolve())
        env["HOME"] = str(workdir)
        env["USER"] = user.name
        limits = isolation.Limits(
            memory_bytes=_megabytes(getattr(spec, "memory_mb_per_task", None)),
            cpus=getattr(spec, "cpus_per_task", None),
        )
        procs = isolation.make_cgroup(cgroup_name, limits)
        sandboxed = self.settings.rank_sandbox == "bwrap" or (
            self.settings.rank_sandbox == "auto" and isolation.bwrap_works()
        )
        if sandboxed and slice_rank and mig is None:
            # Without its ids only all of the GPU's capabilities would do, and with them the
            # rank could run on another team's slice.
            raise isolation.IsolationError("NVML names no GPU and compute instance of the slice")
        if sandboxed:
            if self.mps is None:
                pipes = isolation.mps_pipes(env, os.environ, share=mps) if gpus else []
                hide = isolation.mps_hidden(os.environ, share=bool(pipes))
            else:
                # Every GPU's daemon hidden, the host's too; the rank's own bound over that.
                pipes = [] if mps_pipe is None else [mps_pipe]
                hide = [*isolation.mps_hidden(os.environ, share=False), self.mps.root]
            argv = isolation.bwrap_argv(
                argv,
                state_dir=self.state_dir,
                binds=[workdir, checkpoints, *pipes],
                workdir=workdir,
                hide=hide,
                devices=isolation.gpu_device_nodes(gpus, mig=mig),
            )
        return isolation.Sandbox(argv, user, procs, sandboxed)

    def _mig_listing(self, gpu: int) -> NvmlMigGpu:
        """A slice rank's GPU's MIG instances, as NVML lists them now (none where NVML cannot
        say: the launch then fails, services/agent/devices.py)."""
        if self.sampler is None or gpu >= len(self.sampler.handles):
            return NvmlMigGpu(index=gpu, capable=False, enabled=False)
        return read_mig(self.sampler.nvml, self.sampler.handles[gpu], gpu)

    async def usable_checkpoint(self, starting: Launch, meta: Metadata) -> Path | None:
        """The newest committed checkpoint whose shards still hold what was committed. One that
        does not is recorded as CheckpointCorrupted and the next older one is tried, so a
        resumed job never starts from damaged state when good state exists."""
        job_id = starting.job_id
        stream = f"checkpoint-{job_id}"
        read = await self._from_log(starting, lambda: self.store.read_stream(stream))
        events = [e.payload for e in read]
        for committed in committed_newest_first(events):
            directory = checkpoint_dir(self.root_dir, job_id, committed.checkpoint_id)
            problems = await asyncio.to_thread(verify_committed, directory, committed.shards)
            if not problems:
                return directory
            reason = "verified before resume: " + "; ".join(problems)
            log.warning(
                "checkpoint %s of %s is unusable: %s", committed.checkpoint_id, job_id, reason
            )
            corrupted = CheckpointCorrupted(
                job_id=job_id, checkpoint_id=committed.checkpoint_id, reason=reason
            )
            await self._from_log(
                starting, functools.partial(self.store.append, stream, None, [corrupted], meta)
            )
        return None

    async def _watch(self, rank: RankProcess, meta: Metadata) -> None:
        code = await rank.process.wait()
        cgroup = self._cgroups.pop(rank.key, None)
        # Its GPUs are handed back by the exit recorded below: nothing of it may run on.
        also = functools.partial(isolation.cgroup_pids, cgroup) if cgroup is not None else tuple
        await rank.end_leftovers(self.settings.stop_timeout_s, also)
        # Its GPU's MPS daemon is quit before its exit frees the GPU for another team.
        await self._release_mps(rank.key)
        oom_kills = self._oom_kills.pop(rank.key, None)
        # A rank the agent stopped ended for that reason, whatever else was killed meanwhile.
        out_of_memory = rank.stop_reason is None and killed_for_memory(
            code, oom_kills, await asyncio.to_thread(oom_kill_count, cgroup)
        )
        if cgroup is not None:
            isolation.remove_cgroup(cgroup)
        self.ranks_running.dec()
        reason = OOM_REASON if out_of_memory else rank.stop_reason
        if reason is None and rank.disk_limit is not None and code in SIGXFSZ_EXIT_CODES:
            reason = file_size_reason(rank.disk_limit)
        event = TaskExited(
            job_id=rank.key.job_id,
            attempt=rank.key.attempt,
            rank=rank.key.rank,
            node_id=rank.placement.node_id,
            exit_code=code,
            reason=reason,
            # Past its disk, the next attempt would write as much again: the job fails now.
            permanent=reason is not None and reason.startswith(DISK_LIMIT_REASON),
            out_of_memory=out_of_memory,
        )
        log.info("%s exited with %d (%s)", rank.key, code, rank.stop_reason or "on its own")
        await self._record(event, meta)
        self.ranks.pop(rank.key, None)
        self._release_port_if_done(rank.key)

    async def _record(self, event: TaskStarted | TaskExited, meta: Metadata) -> bool:
        """Append until it is in the log: a rank's start and exit must never be lost (a lost
        exit would hold the gang's GPUs forever), and the process already exists."""
        return await self._append_until_recorded(event.stream, [event], meta)

    async def _append_until_recorded(
        self, stream: str, events: list[TaskStarted | TaskExited], meta: Metadata
    ) -> bool:
        """Append until recorded (True), retrying while the log is away; False only when the
        agent stops with the log still away. Each append is tried at least once, so the exits
        of the ranks a shutdown stops are recorded whenever the log answers; what is given up
        here, the next agent's `reconcile` recovers from the log: a rank recorded as started
        and never as exited is recorded as lost, a gang with no rank recorded as started is
        started again."""
        while True:
            try:
                await self.store.append(stream, None, list(events), meta)
            except (*DATABASE_UNAVAILABLE, asyncpg.PostgresError) as error:
                if self._stopping.is_set() or await self.log_outage.sleep(error, self._stopping):
                    log.warning(
                        "stopping with the log away: %s left unrecorded for the next agent",
                        ", ".join(type(event).__name__ for event in events),
                    )
                    return False
                continue
            self.log_outage.recovered()
            return True

    def attempt_running(self, job_id: str, attempt: int) -> bool:
        """Whether a rank of that attempt still runs here (its log may still grow)."""
        return bool(self._running(job_id, attempt))

    async def retention_loop(self, stop: asyncio.Event) -> None:
        """Every `log_retention_check_s`, delete the working directories and logs of attempts
        that ended more than `log_retention_s` ago."""
        keep = self.settings.log_retention_s
        while not stop.is_set():
            try:
                gone = await asyncio.to_thread(
                    logs.retire, self.work_dir, time.time(), keep, self.attempt_running
                )
                if gone:
                    log.info("retired the logs of %d finished attempts", len(gone))
            except Exception:
                log.exception("log retention round failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.settings.log_retention_check_s)

    async def disk_loop(self, stop: asyncio.Event) -> None:
        """Every `disk_check_s`, kill the ranks whose working directory holds more than their
        limit (services/agent/disk.py)."""
        while not stop.is_set():
            try:
                await self.check_disks()
            except Exception:
                log.exception("disk round failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.settings.disk_check_s)

    async def check_disks(self) -> list[RankKey]:
        """One round: the ranks found over their disk limit, each killed with the reason. A
        rank's working directory is its own; the job's checkpoint directory, which each of
        its ranks may write too, may hold the limits of the job's ranks here together."""
        stopped = []
        by_job: dict[str, list[RankProcess]] = {}
        bounded = [
            rank
            for rank in list(self.ranks.values())
            if rank.disk_limit is not None and rank.running and rank.stop_reason is None
        ]
        processes = await asyncio.to_thread(processes_of, [rank.pid for rank in bounded])
        root_device = _device(self.root_dir)
        for rank in bounded:
            limit = rank.disk_limit
            assert limit is not None
            by_job.setdefault(rank.key.job_id, []).append(rank)
            use = await asyncio.to_thread(disk_use, rank.workdir, limit)
            where = "its working directory"
            if not use.over(limit):
                # Files it deleted but holds open, on the filesystems of its directories.
                devices = {
                    device for device in (_device(rank.workdir), root_device) if device is not None
                }
                held = await asyncio.to_thread(
                    held_deleted, processes[rank.pid], devices, limit.entries
                )
                if held is None:
                    use = DiskUse(use.bytes, use.entries, "more open files than files allowed")
                else:
                    use = DiskUse(use.bytes + held, use.entries)
                    where += " with the files it deleted but holds open" if held else ""
            if use.over(limit):
                stopped += self._kill_for_disk([rank], over_limit_reason(use, limit, where))
        for job_id, ranks in by_job.items():
            ranks = [rank for rank in ranks if rank.stop_reason is None]
            limits = [rank.disk_limit for rank in ranks if rank.disk_limit is not None]
            if not limits:
                continue
            shared = DiskLimit(
                sum(limit.bytes for limit in limits), sum(limit.entries for limit in limits)
            )
            use = await asyncio.to_thread(disk_use, self.root_dir / job_id, shared)
            if use.over(shared):
                reason = over_limit_reason(use, shared, where="its checkpoint directory")
                stopped += self._kill_for_disk(ranks, reason)
        return stopped

    def _kill_for_disk(self, ranks: list[RankProcess], reason: str) -> list[RankKey]:
        killed = []
        for rank in ranks:
            if rank.running and rank.stop_reason is None:
                log.warning("stopping %s: %s", rank.key, reason)
                rank.stop_reason = reason  # at once: the next round must not stop it again
                self._spawn(rank.kill(reason))
                killed.append(rank.key)
        return killed

    def _running(self, job_id: str, attempt: int | None) -> list[RankProcess]:
        return [
            rank
            for key, rank in self.ranks.items()
            if key.job_id == job_id and (attempt is None or key.attempt == attempt) and rank.running
        ]

    async def on_gang_released(self, envelope: EventEnvelope, conn: asyncpg.Connection) -> None:
        event = envelope.payload
        job_id = str(getattr(event, "job_id", ""))
        attempt = getattr(event, "attempt", None)
        reason = event.type.removeprefix("Job").lower()
        for starting in self._launches:
            if starting.job_id == job_id and (attempt is None or starting.attempt == attempt):
                starting.stop(reason)
        for rank in self._running(job_id, attempt):
            self._spawn(rank.stop(reason, self.settings.stop_timeout_s))

    # ------------------------------------------------------------------ checkpoints

    async def on_preemption_requested(
        self, envelope: EventEnvelope, conn: asyncpg.Connection
    ) -> None:
        event = envelope.payload
        assert isinstance(event, PreemptionRequested)
        launching = [
            s for s in self._launches if s.job_id == event.job_id and s.attempt == event.attempt
        ]
        if launching:
            # Its ranks are being started here (a preemption right after the reservation, or
            # while a restarted agent starts its gangs): it was dropped, and the ranks, once
            # up, ran on unasked until the scheduler's grace ran out. Evicted once started.
            self._spawn(self._preempt_once_started(launching, envelope, event))
            return
        ranks = self._running(event.job_id, event.attempt)
        if ranks:
            self._spawn(self._preempt(ranks, envelope, event.grace_s))

    async def _preempt_once_started(
        self, launching: list[Launch], envelope: EventEnvelope, event: PreemptionRequested
    ) -> None:
        """`_preempt` the attempt's ranks once its launch here is over, within what is left
        of the grace."""
        deadline = time.monotonic() + event.grace_s
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(
                asyncio.gather(*(s.over.wait() for s in launching)), event.grace_s
            )
        ranks = self._running(event.job_id, event.attempt)
        if ranks:
            await self._preempt(ranks, envelope, max(0.0, deadline - time.monotonic()))

    async def on_checkpoint_requested(
        self, envelope: EventEnvelope, conn: asyncpg.Connection
    ) -> None:
        event = envelope.payload
        assert isinstance(event, CheckpointRequested)
        ranks = self._running(event.job_id, event.attempt)
        if ranks:
            # A periodic checkpoint gets the default grace: the ranks keep running after it.
            self._spawn(self._checkpoint(ranks, envelope, self.settings.stop_timeout_s * 2))

    async def _preempt(
        self, ranks: list[RankProcess], envelope: EventEnvelope, grace_s: float
    ) -> None:
        """Checkpoint, then evict, within the grace period."""
        deadline = time.monotonic() + grace_s
        for rank in ranks:
            rank.stop_reason = "preempted"
        # Leave time for the stop itself inside the grace.
        budget = max(0.0, grace_s - self.settings.stop_timeout_s)
        checkpoint_id = await self._checkpoint(ranks, envelope, budget)
        # Evict only once the checkpoint service has judged the shards: the eviction releases
        # the gang, and its next attempt must find the commit in the log to resume from it.
        await self._await_outcome(
            ranks[0].key.job_id, checkpoint_id, deadline - self.settings.stop_timeout_s
        )
        remaining = max(0.0, deadline - time.monotonic())
        await asyncio.gather(
            *(r.stop("preempted", min(self.settings.stop_timeout_s, remaining)) for r in ranks)
        )

    async def _checkpoint(
        self, ranks: list[RankProcess], envelope: EventEnvelope, budget_s: float
    ) -> str:
        """Have every rank's shard written; return the checkpoint's id."""
        event = envelope.payload
        attempt = int(getattr(event, "attempt", 1))
        checkpoint_id = checkpoint_id_for(attempt, envelope.event_id)
        directory = checkpoint_dir(self.root_dir, str(getattr(event, "job_id", "")), checkpoint_id)
        # Every rank of the checkpoint, on whichever agent, must name the same step: the
        # request's time is the one value they all share.
        step = int(envelope.recorded_at.timestamp())
        await asyncio.gather(*(self._checkpoint_rank(r, directory, budget_s, step) for r in ranks))
        return checkpoint_id

    async def _await_outcome(self, job_id: str, checkpoint_id: str, until: float) -> bool:
        """Wait (until the monotonic time `until`) for the verdict on `checkpoint_id`
        (committed, corrupted or failed); True if one was recorded."""
        stream = f"checkpoint-{job_id}"
        seen = 0
        while True:
            try:
                for envelope in await self.store.read_stream(stream, seen):
                    seen = envelope.version
                    judged = envelope.payload
                    verdicts = CheckpointCommitted | CheckpointCorrupted | CheckpointFailed
                    if isinstance(judged, verdicts) and (judged.checkpoint_id == checkpoint_id):
                        return True
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as error:
                log.warning("reading %s failed: %r", stream, error)
            if time.monotonic() >= until:
                log.warning(
                    "no outcome for checkpoint %s of %s in time; evicting anyway",
                    checkpoint_id,
                    job_id,
                )
                return False
            await asyncio.sleep(0.2)

    async def _checkpoint_rank(
        self, rank: RankProcess, directory: Path, budget_s: float, step: int
    ) -> None:
        try:
            if rank.checkpoints_itself:
                await self._signal_checkpoint(rank, directory, budget_s, step)
            else:
                # A rank that does not checkpoint itself (the simulated fleet's sleep): the
                # agent saves what it knows of the rank, so the protocol runs end to end.
                state = {
                    "job_id": rank.key.job_id,
                    "attempt": rank.key.attempt,
                    "rank": rank.key.rank,
                    "step": step,
                }
                await asyncio.to_thread(
                    write_shard,
                    directory,
                    rank.key.rank,
                    json.dumps(state).encode(),
                    step=step,
                    under=self.root_dir,
                )
        except (OSError, ValueError) as error:
            log.warning("checkpoint of %s failed: %r", rank.key, error)
            # Tell the checkpoint service at once, with the reason, instead of letting it
            # wait out its deadline: the failure becomes a CheckpointFailed the owner sees.
            with contextlib.suppress(OSError):
                await asyncio.to_thread(
                    record_failure,
                    directory,
                    rank.key.rank,
                    f"{type(error).__name__}: {error}",
                    under=self.root_dir,
                )

    async def _signal_checkpoint(
        self, rank: RankProcess, directory: Path, budget_s: float, step: int
    ) -> None:
        """Ask the rank (SIGUSR1) to write its shard where the request file says; record it."""
        shard = shard_path(directory, rank.key.rank)
        # The directory exists before the signal: a rank's handler writes into it at once.
        await asyncio.to_thread(isolation.directory_like_parent, directory, self.root_dir)
        await asyncio.to_thread(
            write_request, rank.workdir, directory, rank.key.rank, under=self.work_dir
        )
        rank.signal(signal.SIGUSR1)
        deadline = time.monotonic() + budget_s
        while not shard.exists():
            if not rank.running:
                raise OSError(f"rank exited before writing its shard {shard.name}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"no shard {shard.name} within {budget_s:g} s")
            await asyncio.sleep(0.1)
        await asyncio.to_thread(
            record_shard, directory, rank.key.rank, step=step, under=self.root_dir
        )

    # ------------------------------------------------------------------ restart

    async def reconcile(self) -> int:
        """After a restart: every rank on these nodes that the log says started and never
        exited was this agent's predecessor's. Stop what is left of it and record its end,
        so that its gang is not held by ranks nobody watches; stop the ranks it started but
        never recorded; start the gangs of which no rank had started. Returns how many ranks
        it stopped or found gone."""
        types = ["TaskStarted", "TaskExited", "GangReserved"]
        started: dict[tuple[str, int, int], TaskStarted] = {}
        ever_started: set[tuple[str, int, int]] = set()
        # Each job's latest gang with ranks on these nodes: its launch may have been cut short.
        latest: dict[str, EventEnvelope] = {}
        position = 0
        while batch := await self.store.read_all(position, 5000, types=types):
            for envelope in batch:
                event = envelope.payload
                if isinstance(event, TaskStarted | TaskExited) and event.node_id in self.nodes:
                    key = (event.job_id, event.attempt, event.rank)
                    if isinstance(event, TaskStarted):
                        started[key] = event
                        ever_started.add(key)
                    else:
                        started.pop(key, None)
                elif isinstance(event, GangReserved) and any(
                    r.node_id in self.nodes for r in event.ranks
                ):
                    latest[event.job_id] = envelope
                position = envelope.position or position
        # Ranks started by a predecessor that died before their TaskStarted was recorded:
        # stopped first (nothing to record: the log never saw them), so that no rank runs
        # twice when its gang is started again (`_resume_launches`).
        strays = await asyncio.to_thread(unrecorded_ranks, self.work_dir, self.nodes, started)
        for pgid, key in strays.items():
            await kill_until_gone(functools.partial(group_members, pgid))
            log.warning("%s/%d rank %d: left unrecorded by a crash; stopped", *key)
        for (job_id, attempt, rank), event in started.items():
            self.launched.add((job_id, attempt, rank))
            workdir = self.work_dir / job_id / f"a{attempt}" / f"rank-{rank}"
            orphan = await asyncio.to_thread(stop_orphan, workdir, job_id)
            # rank.pid lies in the directory the rank owns, which it may have emptied or
            # filled with another pid: its cgroup, which only root may leave, is asked too.
            # Recorded as exited only once they are gone: the exit hands its GPUs back.
            cgroup = self.cgroup_name(RankKey(job_id, attempt, rank))
            killed = await kill_until_gone(functools.partial(_rank_processes, cgroup, orphan))
            killed = killed or orphan is not None
            isolation.remove_cgroup(cgroup)
            exited = TaskExited(
                job_id=job_id,
                attempt=attempt,
                rank=rank,
                node_id=event.node_id,
                exit_code=-int(signal.SIGKILL) if killed else -1,
                reason=AGENT_RESTARTED + ("stopped" if killed else "lost"),
            )
            await self.store.append(exited.stream, None, [exited])
            log.warning(
                "%s/%d rank %d on %s: %s", job_id, attempt, rank, event.node_id, exited.reason
            )
        if self.mps is not None:
            # Its MPS daemons, once their clients (its ranks) are stopped.
            await self.mps.quit_leftovers()
        await self._resume_launches(latest.values(), ever_started)
        return len(started) + len(strays)

    async def _resume_launches(
        self, gangs: Iterable[EventEnvelope], ever_started: set[tuple[str, int, int]]
    ) -> None:
        """Start the ranks a predecessor never started of gangs none of whose ranks here
        started: their GangReserved was consumed (ranks are launched in the background), so
        it will not be delivered again, and the gang would wait out the launch timeout. A gang
        of which some rank here started is ending (its ranks were just stopped): left alone."""
        for envelope in gangs:
            reserved = envelope.payload
            assert isinstance(reserved, GangReserved)
            ours = [
                (reserved.job_id, reserved.attempt, r.rank)
                for r in reserved.ranks
                if r.node_id in self.nodes
            ]
            if any(key in ever_started for key in ours):
                continue
            try:
                await self._start_gang(envelope)
            except DomainError as error:
                log.warning("not resuming %s/%d: %s", reserved.job_id, reserved.attempt, error)

    # ------------------------------------------------------------------ shutdown

    async def shutdown(self) -> None:
        """Stop every rank (their exits are recorded while the log answers) and wait for the
        bookkeeping; with the log away, what is left unrecorded is its successor's
        (`reconcile`), so that the agent stops promptly whatever the log does."""
        self._stopping.set()
        for starting in self._launches:
            starting.stop("agent stopped")
        await self.launches_done()
        ranks = [rank for rank in self.ranks.values() if rank.running]
        await asyncio.gather(
            *(r.stop("agent stopped", self.settings.stop_timeout_s) for r in ranks)
        )
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=self.settings.stop_timeout_s + 5)
        if self.mps is not None:
            await self.mps.stop_all()


def _log_failure(task: asyncio.Task[Any]) -> None:
    """A background task's exception is logged, never left unretrieved."""
    if not task.cancelled() and (error := task.exception()) is not None:
        log.error("agent task %s failed", task.get_name(), exc_info=error)


def _megabytes(value: int | None) -> int | None:
    return None if value is None else int(value) * 1024 * 1024


def _device(path: Path) -> int | None:
    try:
        return path.stat().st_dev
    except OSError:
        return None  # not made yet, or gone


def _rank_processes(cgroup: str, orphan: int | None) -> set[int]:
    """A predecessor's rank's processes: its cgroup's, and its process group's."""
    found = isolation.cgroup_pids(cgroup)
    if orphan is not None:
        found.update(group_members(orphan))
    return found
