"""The admission process's settings: the shared runtime settings plus its metrics port."""

from __future__ import annotations

from pydantic import Field

from services.runtime.settings import Settings


class AdmissionSettings(Settings):
    service_name: str = "admission"
    metrics_port: int = Field(default=9101, ge=0, le=65535)
