"""SM activity from NVML's GPU Performance Monitoring (GPM), where the GPU offers it.

GPM (Hopper and later) gives a metric between two samples of a GPU's counters: here
`NVML_GPM_METRIC_SM_UTIL`, the share of SMs that were busy, which says how much of the GPU the
work fills (NVML's `utilization` only says that some kernel was running). Read-only: it takes
samples, it never enables streaming or changes a setting. The first heartbeat of a GPU has no
value (one sample makes no interval); a GPU without GPM support, or a reading that fails,
reports none rather than a guess.
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)


class GpmSmActivity:
    def __init__(self, nvml: Any, handles: list[Any]) -> None:
        self.nvml = nvml
        self.handles: dict[int, Any] = {}
        for index, handle in enumerate(handles):
            try:
                supported = bool(nvml.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice)
            except Exception:  # an older driver or GPU: no GPM at all
                supported = False
            if supported:
                self.handles[index] = handle
        if handles and not self.handles:
            log.info("NVML GPM unavailable on this host: no SM activity in heartbeats")
        # GPU index -> its previous sample (freed once replaced).
        self._previous: dict[int, Any] = {}

    def read(self) -> dict[int, float]:
        """Percent of SMs busy since the previous call, per GPU that offers GPM."""
        found: dict[int, float] = {}
        for index, handle in self.handles.items():
            try:
                sample = self.nvml.nvmlGpmSampleAlloc()
            except Exception:
                log.debug("GPM sample of GPU %d not allocated", index, exc_info=True)
                continue
            try:
                self.nvml.nvmlGpmSampleGet(handle, sample)
            except Exception:
                log.debug("GPM sample of GPU %d failed", index, exc_info=True)
                self._free(sample)
                continue
            previous = self._previous.pop(index, None)
            self._previous[index] = sample
            if previous is None:
                continue
            try:
                value = self._sm_util(previous, sample)
            finally:
                self._free(previous)
            if value is not None:
                found[index] = min(100.0, max(0.0, value))
        return found

    def _sm_util(self, first: Any, second: Any) -> float | None:
        nvml = self.nvml
        request = nvml.c_nvmlGpmMetricsGet_t()
        request.version = nvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = 1
        request.sample1 = first
        request.sample2 = second
        request.metrics[0].metricId = nvml.NVML_GPM_METRIC_SM_UTIL
        try:
            answer = nvml.nvmlGpmMetricsGet(request)
        except Exception:
            log.debug("GPM metrics failed", exc_info=True)
            return None
        metric = answer.metrics[0]
        if int(metric.nvmlReturn) != int(nvml.NVML_SUCCESS):
            return None
        return float(metric.value)

    def _free(self, sample: Any) -> None:
        try:
            self.nvml.nvmlGpmSampleFree(sample)
        except Exception:
            log.debug("GPM sample not freed", exc_info=True)

    def close(self) -> None:
        for sample in self._previous.values():
            self._free(sample)
        self._previous.clear()
