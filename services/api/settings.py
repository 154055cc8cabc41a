"""The API process's settings: the shared runtime settings plus what only the API needs."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, SecretStr

from services.runtime.settings import Settings


class ApiSettings(Settings):
    api_host: str = "127.0.0.1"
    api_port: int = Field(default=8080, ge=1, le=65535)
    # The admin's bearer token; when unset it is read from (or generated into) admin_token_file.
    admin_token: SecretStr | None = None
    admin_token_file: Path = Path(".gangway/admin.token")
    max_body_bytes: int = Field(default=1024 * 1024, ge=1024)
    # /readyz fails while the read models trail the log's head by more than this many events.
    ready_max_lag: int = Field(default=1000, ge=0)
    # How far one GET /v1/events may scan the log to fill a filtered page before it returns
    # a shorter page with a cursor to continue from.
    events_scan_limit: int = Field(default=20_000, ge=100)
    # How often the read models re-check the log for events the bus has not (yet) delivered.
    catch_up_interval_s: float = Field(default=2.0, gt=0)
    consumer_group: str = "api"
