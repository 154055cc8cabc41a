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


@dataclass(eq=False)
class DeviceRef:
    """GPU `index` as an NVML event names it: a new ctypes pointer, equal to no handle the
    sampler holds (ctypes compares pointers by identity)."""

    index: int


@dataclass
class XidEvent:
    device: DeviceRef
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

    def nvmlDeviceGetIndex(self, handle: int | DeviceRef) -> int:
        return handle.index if isinstance(handle, DeviceRef) else handle

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
    driver.pending.append(XidEvent(device=DeviceRef(3), eventData=79))
    first = sampler.heartbeat("host-a", NOW)
    assert first.gpus[3].xid_errors == [79]
    assert all(not g.xid_errors for g in sampler.heartbeat("host-a", NOW).gpus)


def test_an_xid_of_a_gpu_nvml_cannot_name_is_reported_on_every_gpu_not_lost() -> None:
    class Unnamed(FakeDriver):
        def nvmlDeviceGetIndex(self, handle: int | DeviceRef) -> int:
            raise Timeout  # any NVML error

    driver = Unnamed(2)
    sampler = NvmlSampler(driver)
    driver.pending.append(XidEvent(device=DeviceRef(1), eventData=48))
    assert [g.xid_errors for g in sampler.heartbeat("host-a", NOW).gpus] == [[48], [48]]


def test_a_gpu_lost_before_the_agent_started_is_reported_fallen_off_the_bus_and_drains() -> None:
    class Lost(FakeDriver):
        def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
            if index == 1:
                raise Timeout  # NVMLError_GpuIsLost
            return index

    sampler = NvmlSampler(Lost(3))
    heartbeat = sampler.heartbeat("host-a", NOW)
    assert [g.xid_errors for g in heartbeat.gpus] == [[], [79], []]
    assert heartbeat.gpus[1].temperature_c is None
    assert heartbeat.gpus[2].temperature_c == 62  # the others read as ever
    events = HealthMonitor().observe_heartbeat(heartbeat)
    assert [(type(e).__name__, getattr(e, "gpu_index", None)) for e in events][:1] == [
        ("GpuUnhealthy", 1)
    ]
    assert "NodeDrainRequested" in {type(e).__name__ for e in events}


def test_uncorrected_ecc_counts_reach_the_heartbeat() -> None:
    driver = FakeDriver(2)
    driver.ecc[1] = 2
    heartbeat = NvmlSampler(driver).heartbeat("host-a", NOW)
    assert [g.ecc_uncorrected for g in heartbeat.gpus] == [0, 2]


def test_an_injected_fault_overrides_the_real_reading() -> None:
    fault = parse_fault('{"gpus": {"0": {"temperature_c": 99}}}')
    heartbeat = NvmlSampler(FakeDriver(2)).heartbeat("host-a", NOW, fault)
    assert heartbeat.gpus[0].temperature_c == 99


@dataclass
class GpmSupport:
    isSupportedDevice: int  # NVML's field name


@dataclass
class GpmSample:
    """A GPU's SM-busy counter when sampled (a fake of NVML's opaque sample)."""

    handle: int = -1
    busy_cycles: int = 0
    cycles: int = 0


@dataclass
class GpmMetric:
    metricId: int = 0
    nvmlReturn: int = 0
    value: float = 0.0


class GpmMetricsGet:
    def __init__(self) -> None:
        self.version = 0
        self.numMetrics = 0
        self.sample1: GpmSample | None = None
        self.sample2: GpmSample | None = None
        self.metrics = [GpmMetric() for _ in range(8)]


class GpmDriver(FakeDriver):
    """A Hopper host: GPM on the GPUs in `gpm`; each GPU's SMs busy `sm_busy[i]` percent."""

    NVML_SUCCESS = 0
    NVML_GPM_METRICS_GET_VERSION = 1
    NVML_GPM_METRIC_SM_UTIL = 2
    c_nvmlGpmMetricsGet_t = GpmMetricsGet

    def __init__(self, gpus: int, gpm: set[int]) -> None:
        super().__init__(gpus)
        self.gpm = gpm
        self.sm_busy = dict.fromkeys(range(gpus), 0.0)
        self.clock = dict.fromkeys(range(gpus), 0)
        self.busy = dict.fromkeys(range(gpus), 0.0)
        self.live: list[GpmSample] = []

    def run(self, cycles: int) -> None:
        """Let the GPUs run `cycles` cycles at their SM activity."""
        for index in self.clock:
            self.clock[index] += cycles
            self.busy[index] += cycles * self.sm_busy[index] / 100

    def nvmlGpmQueryDeviceSupport(self, handle: int) -> GpmSupport:
        return GpmSupport(isSupportedDevice=int(handle in self.gpm))

    def nvmlGpmSampleAlloc(self) -> GpmSample:
        sample = GpmSample()
        self.live.append(sample)
        return sample

    def nvmlGpmSampleFree(self, sample: GpmSample) -> None:
        self.live.remove(sample)

    def nvmlGpmSampleGet(self, handle: int, sample: GpmSample) -> GpmSample:
        assert handle in self.gpm
        sample.handle, sample.busy_cycles = handle, int(self.busy[handle])
        sample.cycles = self.clock[handle]
        return sample

    def nvmlGpmMetricsGet(self, request: GpmMetricsGet) -> GpmMetricsGet:
        first, second = request.sample1, request.sample2
        assert first is not None and second is not None and first.handle == second.handle
        assert request.metrics[0].metricId == self.NVML_GPM_METRIC_SM_UTIL
        elapsed = second.cycles - first.cycles
        busy = second.busy_cycles - first.busy_cycles
        request.metrics[0].value = 100.0 * busy / elapsed if elapsed else 0.0
        return request


def test_sm_activity_comes_from_gpm_between_two_heartbeats_on_gpus_that_offer_it() -> None:
    driver = GpmDriver(2, gpm={0})
    sampler = NvmlSampler(driver)
    first = sampler.heartbeat("host-a", NOW)
    assert [g.sm_activity for g in first.gpus] == [None, None]  # one sample is no interval
    driver.sm_busy[0] = 40.0
    driver.run(1000)
    second = sampler.heartbeat("host-a", NOW)
    assert second.gpus[0].sm_activity == 40.0
    assert second.gpus[1].sm_activity is None  # no GPM on GPU 1: none, not 0
    driver.sm_busy[0] = 75.0
    driver.run(1000)
    assert sampler.heartbeat("host-a", NOW).gpus[0].sm_activity == 75.0
    assert len(driver.live) == 1  # every sample but the latest freed


def test_a_failed_gpm_reading_reports_nothing_and_leaks_no_sample() -> None:
    class Flaky(GpmDriver):
        failing = False

        def nvmlGpmSampleGet(self, handle: int, sample: GpmSample) -> GpmSample:
            if self.failing:
                raise Timeout
            return super().nvmlGpmSampleGet(handle, sample)

    driver = Flaky(1, gpm={0})
    sampler = NvmlSampler(driver)
    sampler.heartbeat("host-a", NOW)
    driver.failing = True
    assert sampler.heartbeat("host-a", NOW).gpus[0].sm_activity is None
    assert len(driver.live) == 1  # the failed sample freed, the last good one kept
    driver.failing = False
    driver.sm_busy[0] = 50.0
    driver.run(100)
    assert sampler.heartbeat("host-a", NOW).gpus[0].sm_activity == 50.0


def test_a_driver_without_gpm_reports_no_sm_activity() -> None:
    sampler = NvmlSampler(FakeDriver(2))
    sampler.heartbeat("host-a", NOW)
    assert [g.sm_activity for g in sampler.heartbeat("host-a", NOW).gpus] == [None, None]


def test_a_reading_nvml_refuses_does_not_take_the_ecc_count_with_it() -> None:
    """On a MIG-enabled GPU NVML answers NOT_SUPPORTED for utilisation: the readings after it
    (memory, the uncorrected ECC count) were never taken, so health could not see the ECC
    errors of a MIG GPU at all."""

    class MigEnabled(FakeDriver):
        def nvmlDeviceGetUtilizationRates(self, handle: int) -> Utilization:
            raise Timeout  # any NVML error

    driver = MigEnabled(2)
    driver.ecc[1] = 3
    heartbeat = NvmlSampler(driver).heartbeat("host-a", NOW)
    assert [g.utilization for g in heartbeat.gpus] == [None, None]
    assert [g.ecc_uncorrected for g in heartbeat.gpus] == [0, 3]
    assert [g.memory_used_mb for g in heartbeat.gpus] == [4096, 4096]
    assert heartbeat.gpus[1].temperature_c == 61


def test_an_xid_of_a_gpu_the_sampler_holds_no_handle_of_is_not_lost() -> None:
    driver = FakeDriver(2)
    sampler = NvmlSampler(driver)
    driver.pending.append(XidEvent(device=DeviceRef(5), eventData=79))
    assert [g.xid_errors for g in sampler.heartbeat("host-a", NOW).gpus] == [[79], [79]]
