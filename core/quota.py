"""Hierarchical queues: guarantees, borrowing ceilings, and who is borrowing now."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from core.live_sharing import GpuAmount
from core.state import QueueRecord

MAX_DEPTH = 16  # a misconfigured parent loop must not hang the cycle


@dataclass(frozen=True, slots=True)
class HostRoom:
    """Tasks the host ceilings of a queue chain still allow (None: unbounded), and the queue,
    resource (`cpus` or `memory`) and ceiling (thousandths of a CPU, MB) that bound them."""

    tasks: int | None
    queue: str | None
    resource: str | None
    limit: int | None


class QuotaBook:
    """Usage per queue subtree for one cycle; charged as gangs are placed or planned away."""

    def __init__(self, queues: Mapping[str, QueueRecord]) -> None:
        self._queues = queues
        self._chains: dict[str, tuple[str, ...]] = {}
        self.usage: dict[str, GpuAmount] = {}
        # How many charges the book has taken: its GPU answers (`ceiling_hit`, `excess`,
        # `within_guarantee`, `borrowing`) stand while this does not move (`usage` is written by
        # `charge` alone, and the queues' records do not change within the cycle owning it).
        self.charges = 0
        # CPUs (thousandths) and memory (MB) held per subtree, for the host ceilings.
        self.host_usage: dict[str, tuple[int, int]] = {}
        for name, queue in queues.items():
            if queue.allocated:
                self.charge(name, queue.allocated)
            if queue.allocated_cpus_milli or queue.allocated_memory_mb:
                self.charge_host(name, queue.allocated_cpus_milli, queue.allocated_memory_mb)

    def chain(self, name: str) -> tuple[str, ...]:
        """The queue and its ancestors, leaf first."""
        cached = self._chains.get(name)
        if cached is not None:
            return cached
        chain: list[str] = []
        current: str | None = name
        while current is not None and current not in chain and len(chain) < MAX_DEPTH:
            chain.append(current)
            record = self._queues.get(current)
            current = record.parent if record is not None else None
        result = tuple(chain)
        self._chains[name] = result
        return result

    def charge(self, name: str, gpus: GpuAmount) -> None:
        self.charges += 1
        for queue in self.chain(name):
            self.usage[queue] = self.usage.get(queue, 0) + gpus

    def charge_host(self, name: str, cpus_milli: int, memory_mb: int) -> None:
        """Account CPUs and memory to the queue's chain. Gangs leaving within a cycle are not
        credited back: a host ceiling errs on the safe side for one cycle at most."""
        for queue in self.chain(name):
            cpus, memory = self.host_usage.get(queue, (0, 0))
            self.host_usage[queue] = (cpus + cpus_milli, memory + memory_mb)

    def host_room(self, name: str, cpus_milli: int, memory_mb: int) -> HostRoom:
        """How many more tasks of (CPUs, memory) each the chain's host ceilings allow, and the
        first queue and resource that bounds it (None: no ceiling applies)."""
        room = HostRoom(None, None, None, None)
        for queue in self.chain(name):
            record = self._queues.get(queue)
            if record is None:
                continue
            used_cpus, used_memory = self.host_usage.get(queue, (0, 0))
            for resource, limit, used, ask in (
                ("cpus", record.max_cpus_milli, used_cpus, cpus_milli),
                ("memory", record.max_memory_mb, used_memory, memory_mb),
            ):
                if limit is None or not ask:
                    continue
                tasks = max(0, limit - used) // ask
                if room.tasks is None or tasks < room.tasks:
                    room = HostRoom(tasks, queue, resource, limit)
        return room

    def ceiling_hit(self, name: str, gpus: GpuAmount) -> tuple[str, int] | None:
        """The first queue on the chain whose max the gang would exceed, with that max."""
        for queue in self.chain(name):
            record = self._queues.get(queue)
            if record is None or record.max_gpus is None:
                continue
            if self.usage.get(queue, 0) + gpus > record.max_gpus:
                return queue, record.max_gpus
        return None

    def excess(self, name: str, gpus: GpuAmount) -> dict[str, GpuAmount]:
        """Each queue on the chain whose max the gang would exceed: by how many GPUs.

        Evicting gangs of a queue's subtree gives it room again (the preemption planner uses
        this to reclaim a guarantee under a parent's ceiling that a sibling's borrowing filled).
        """
        over: dict[str, GpuAmount] = {}
        for queue in self.chain(name):
            record = self._queues.get(queue)
            if record is None or record.max_gpus is None:
                continue
            beyond = self.usage.get(queue, 0) + gpus - record.max_gpus
            if beyond > 0:
                over[queue] = beyond
        return over

    def guarantee(self, name: str) -> int:
        record = self._queues.get(name)
        return record.guaranteed_gpus if record is not None and record.configured else 0

    def guaranteed(self) -> frozenset[str]:
        """The queues whose `guarantee` is above 0 (every other queue's is 0)."""
        return frozenset(name for name in self._queues if self.guarantee(name) > 0)

    def within_guarantee(self, name: str, gpus: GpuAmount) -> bool:
        """Would the queue stay within its guarantee with `gpus` more? (It may then reclaim.)"""
        record = self._queues.get(name)
        if record is None or not record.configured or record.guaranteed_gpus <= 0:
            return False
        return self.usage.get(name, 0) + gpus <= record.guaranteed_gpus

    def borrowing(self, name: str) -> GpuAmount:
        """GPUs the queue uses beyond its guarantee (0 when it is within it)."""
        return max(0, self.usage.get(name, 0) - self.guarantee(name))
