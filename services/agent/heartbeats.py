"""Heartbeats: synthetic readings for simulated nodes, NVML readings for real GPUs."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime
from typing import Any

from schemas.nodes import NodeRegistered
from schemas.telemetry import GpuSample, NodeHeartbeat
from services.agent.faults import HEALTHY, Fault
from services.agent.gpm import GpmSmActivity
from services.agent.nic import FabricLinks

log = logging.getLogger(__name__)

HEALTHY_TEMPERATURE_C = 55.0
# A simulated busy GPU: NVML's utilization says a kernel ran nearly all the time; GPM's SM
# activity, how much of the GPU it filled (a real training step rarely fills every SM).
BUSY_UTILIZATION = 95.0
BUSY_SM_ACTIVITY = 70.0
NIC_EXPECTED_GBPS = 400.0


def synthetic_heartbeat(
    node: NodeRegistered, at: datetime, fault: Fault = HEALTHY, busy: set[int] | None = None
) -> NodeHeartbeat:
    """A healthy node's readings, with the injected fault laid over them."""
    busy = busy or set()
    gpus = []
    for gpu in node.gpus:
        readings: dict[str, Any] = {
            "index": gpu.index,
            "temperature_c": HEALTHY_TEMPERATURE_C + (15.0 if gpu.index in busy else 0.0),
            "ecc_uncorrected": 0,
            "xid_errors": [],
            "utilization": BUSY_UTILIZATION if gpu.index in busy else 0.0,
            "sm_activity": BUSY_SM_ACTIVITY if gpu.index in busy else 0.0,
            "memory_used_mb": gpu.memory_mb // 2 if gpu.index in busy else 0,
        }
        readings.update(fault.gpus.get(gpu.index, {}))
        gpus.append(GpuSample.model_validate(readings))
    return NodeHeartbeat(
        node_id=node.node_id,
        at=at,
        gpus=gpus,
        nic_gbps=NIC_EXPECTED_GBPS if fault.nic_gbps is None else fault.nic_gbps,
        nic_expected_gbps=NIC_EXPECTED_GBPS,
    )


# What a heartbeat reads of each GPU through NVML: (GpuSample field, reader).
_READINGS: tuple[tuple[str, Callable[[Any, Any], float | int]], ...] = (
    (
        "temperature_c",
        lambda nvml, h: float(nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU)),
    ),
    ("utilization", lambda nvml, h: float(nvml.nvmlDeviceGetUtilizationRates(h).gpu)),
    ("memory_used_mb", lambda nvml, h: int(nvml.nvmlDeviceGetMemoryInfo(h).used) >> 20),
    (
        "ecc_uncorrected",
        lambda nvml, h: int(
            nvml.nvmlDeviceGetTotalEccErrors(
                h, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC
            )
        ),
    ),
)


# What the driver logs when a GPU falls off the bus (NVML then answers GPU_IS_LOST for it): a
# GPU lost before the agent started is reported with it, as it would have been had it fallen
# while the agent watched.
GPU_LOST_XID = 79


def _handle(nvml: Any, index: int) -> Any:
    """GPU `index`'s NVML handle, or None when NVML cannot give one (the GPU is lost)."""
    try:
        return nvml.nvmlDeviceGetHandleByIndex(index)
    except Exception as error:  # NVMLError_GpuIsLost, _Unknown …
        log.warning("GPU %d has no NVML handle (%s): reported lost", index, error)
        return None


class NvmlSampler:
    """Reads temperature, utilisation, memory and ECC counters of the host's GPUs, their SM
    activity through NVML GPM where the GPU offers it (services/agent/gpm.py), and the host's
    network links from the kernel (`links`, services/agent/nic.py).

    XIDs reach NVML as events; the sampler registers for them once and drains what arrived
    since the last heartbeat.
    """

    def __init__(self, nvml: Any, links: FabricLinks | None = None) -> None:
        self.nvml = nvml
        self.links = links
        nvml.nvmlInit()
        # None: a GPU lost (fallen off the bus) before the agent started; it is reported so.
        self.handles: list[Any] = [
            _handle(nvml, index) for index in range(nvml.nvmlDeviceGetCount())
        ]
        self.event_set: Any = None
        try:
            self.event_set = nvml.nvmlEventSetCreate()
        except Exception:  # not every driver supports XID events
            log.warning("NVML XID events unavailable", exc_info=True)
        for handle in self.handles:
            if self.event_set is None or handle is None:
                continue
            try:
                nvml.nvmlDeviceRegisterEvents(
                    handle, nvml.nvmlEventTypeXidCriticalError, self.event_set
                )
            except Exception:  # a GPU that offers none: its XIDs come from no event
                log.warning("NVML XID events of a GPU unavailable", exc_info=True)
        # A lost GPU's None fails GPM's support query: no SM activity for it, indices kept.
        self.gpm = GpmSmActivity(nvml, self.handles)

    def _xids(self) -> dict[int, list[int]]:
        found: dict[int, list[int]] = {}
        if self.event_set is None:
            return found
        while True:
            try:
                data = self.nvml.nvmlEventSetWait_v2(self.event_set, 0)
            except Exception:  # NVML_ERROR_TIMEOUT: nothing more pending
                return found
            # The event's device is a new ctypes pointer, equal to none of our handles (ctypes
            # compares pointers by identity): its GPU is asked of NVML.
            try:
                named: int | None = int(self.nvml.nvmlDeviceGetIndex(data.device))
            except Exception:
                log.warning("XID %s on a GPU NVML cannot name", data.eventData, exc_info=True)
                named = None
            # A GPU NVML cannot name, or one the sampler holds no handle of (none of its
            # heartbeat's GPUs): the XID is lost nowhere, blamed on every GPU.
            everyone = range(len(self.handles))
            for index in [named] if named is not None and named in everyone else everyone:
                found.setdefault(index, []).append(int(data.eventData))

    def _links(self) -> tuple[float | None, float | None]:
        """The links' reading; none when sysfs will not give one (a heartbeat without it beats
        no heartbeat: a round that raised would silence the node, and silence drains it)."""
        if self.links is None:
            return None, None
        try:
            return self.links.read()
        except Exception:
            log.warning("network links unreadable", exc_info=True)
            return None, None

    def heartbeat(self, node_id: str, at: datetime, fault: Fault = HEALTHY) -> NodeHeartbeat:
        nvml = self.nvml
        xids = self._xids()
        sm_activity = self.gpm.read()
        gpus = []
        for index, handle in enumerate(self.handles):
            readings: dict[str, Any] = {
                "index": index,
                "xid_errors": xids.get(index, []),
                "sm_activity": sm_activity.get(index),
            }
            if handle is None:
                readings["xid_errors"] = [*readings["xid_errors"], GPU_LOST_XID]
            else:
                # Each reading on its own: one NVML refuses (utilisation on a MIG-enabled GPU
                # is NOT_SUPPORTED) took the ones after it along, the uncorrected ECC count too.
                for field, read in _READINGS:
                    try:
                        readings[field] = read(nvml, handle)
                    except Exception:  # a GPU without ECC, or one gone: what could be read
                        log.debug("NVML %s of GPU %d unreadable", field, index, exc_info=True)
            readings.update(fault.gpus.get(index, {}))
            gpus.append(GpuSample.model_validate(readings))
        nic_gbps, expected = self._links()
        if fault.nic_gbps is not None:
            nic_gbps, expected = fault.nic_gbps, expected or NIC_EXPECTED_GBPS
        return NodeHeartbeat(
            node_id=node_id, at=at, gpus=gpus, nic_gbps=nic_gbps, nic_expected_gbps=expected
        )
