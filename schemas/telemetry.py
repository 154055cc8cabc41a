"""Telemetry: heartbeats and raw samples on the telemetry topic, never in the log."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import Field, TypeAdapter

from schemas.base import Message


class GpuSample(Message):
    index: int = Field(ge=0)
    temperature_c: float | None = None
    ecc_uncorrected: int = Field(default=0, ge=0)
    xid_errors: list[int] = Field(default_factory=list)
    utilization: float | None = Field(default=None, ge=0, le=100)
    # Percent of the SMs busy over the last interval (NVML GPM, Hopper and later): how much
    # of the GPU the work really fills, where `utilization` only says a kernel was running.
    sm_activity: float | None = Field(default=None, ge=0, le=100)
    memory_used_mb: int | None = Field(default=None, ge=0)


class NodeHeartbeat(Message):
    kind: Literal["heartbeat"] = "heartbeat"
    node_id: str
    at: datetime
    gpus: list[GpuSample] = Field(default_factory=list)
    nic_gbps: float | None = Field(default=None, ge=0)
    nic_expected_gbps: float | None = Field(default=None, ge=0)


class StepTimeSample(Message):
    kind: Literal["step_time"] = "step_time"
    job_id: str
    attempt: int = Field(ge=1)
    rank: int = Field(ge=0)
    node_id: str
    step: int = Field(ge=0)
    step_time_s: float = Field(gt=0)
    at: datetime


TelemetryMessage = Annotated[NodeHeartbeat | StepTimeSample, Field(discriminator="kind")]
TELEMETRY: TypeAdapter[NodeHeartbeat | StepTimeSample] = TypeAdapter(TelemetryMessage)
