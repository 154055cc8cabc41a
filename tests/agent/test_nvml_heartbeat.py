"""Heartbeats of a real GPU host, read through NVML (a fake driver stands in for the GPUs)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from datetime import UTC, datetime

from services.agent.faults import parse_fault
from services.agent.heartbeats import NvmlSampler
from services.health.rules import HealthMonitor

NOW = datetime(2026, 11, 22, tzinfo=UTC)


@dataclass
class Utilization:
    gpu: int


@dataclass
class Memory:
    used: int


@dataclass
class XidEvent:
    device: int
    eventData: int  # NVML's field name


class Timeout(Exception):
    pass


class FakeDriver:
    NVML_TEMPERATURE_GPU = 0
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
    NVML_VOLATILE_ECC = 0
    nvmlEventTypeXidCriticalError = 8

    def __init__(self, gpus: int) -> None:
        self.gpus = gpus
        self.pending: deque[XidEvent] = deque()
        self.ecc = dict.fromkeys(range(gpus), 0)

    def nvmlInit(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return self.gpus

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlEventSetCreate(self) -> str:
        return "events"

    def nvmlDeviceRegisterEvents(self, handle: int, kinds: int, event_set: str) -> None:
        pass

    def nvmlEventSetWait_v2(self, event_set: str, timeout_ms: int) -> XidEvent:
        if not self.pending:
            raise Timeout
        return self.pending.popleft()

    def nvmlDeviceGetTemperature(self, handle: int, sensor: int) -> int:
        return 60 + handle

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> Utilization:
        return Utilization(gpu=90)

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> Memory:
        return Memory(used=4 << 30)

    def nvmlDeviceGetTotalEccErrors(self, handle: int, kind: int, counter: int) -> int:
        return self.ecc[handle]


def test_a_healthy_host_reports_every_gpu_and_nothing_for_health_to_record() -> None:
    heartbeat = NvmlSampler(FakeDriver(4)).heartbeat("host-a", NOW)
    assert [g.index for g in heartbeat.gpus] == [0, 1, 2, 3]
    assert heartbeat.gpus[2].temperature_c == 62
    assert heartbeat.gpus[0].memory_used_mb == 4096
    assert HealthMonitor().observe_heartbeat(heartbeat) == []


def test_an_xid_event_is_reported_once_with_its_gpu() -> None:
    driver = FakeDriver(4)
    sampler = NvmlSampler(driver)
    driver.pending.append(XidEvent(device=3, eventData=79))
    first = sampler.heartbeat("host-a", NOW)
    assert first.gpus[3].xid_errors == [79]
    assert all(not g.xid_errors for g in sampler.heartbeat("host-a", NOW).gpus)


def test_uncorrected_ecc_counts_reach_the_heartbeat() -> None:
    driver = FakeDriver(2)
    driver.ecc[1] = 2
    heartbeat = NvmlSampler(driver).heartbeat("host-a", NOW)
    assert [g.ecc_uncorrected for g in heartbeat.gpus] == [0, 2]


def test_an_injected_fault_overrides_the_real_reading() -> None:
    fault = parse_fault('{"gpus": {"0": {"temperature_c": 99}}}')
    heartbeat = NvmlSampler(FakeDriver(2)).heartbeat("host-a", NOW, fault)
    assert heartbeat.gpus[0].temperature_c == 99
