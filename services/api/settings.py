"""The API process's settings: the shared runtime settings plus what only the API needs."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

from pydantic import Field, SecretStr

from services.runtime.limits import MAX_REQUEST_BODY_BYTES
from services.runtime.settings import Settings


class ApiSettings(Settings):
    # Where to listen; unset, both come from api_url, the address everyone else is told.
    api_host: str | None = None
    api_port: int | None = Field(default=None, ge=1, le=65535)
    # The admin's bearer token; when unset it is read from (or generated into) admin_token_file.
    admin_token: SecretStr | None = None
    admin_token_file: Path = Path(".gangway/admin.token")
    # Below the log's event bound and the bus's record bound (services/runtime/limits.py).
    max_body_bytes: int = Field(default=MAX_REQUEST_BODY_BYTES, ge=1024, le=MAX_REQUEST_BODY_BYTES)
    # A request body not wholly received within this long gets 408 and a closed connection.
    body_read_timeout_s: float = Field(default=10.0, gt=0)
    # /readyz fails while the read models trail the log's head by more than this many events.
    ready_max_lag: int = Field(default=1000, ge=0)
    # How far one GET /v1/events may scan the log to fill a filtered page before it returns
    # a shorter page with a cursor to continue from.
    events_scan_limit: int = Field(default=20_000, ge=100)
    # Where a GET /v1/jobs page ends at the latest, in bytes of its jobs' specs (at least one
    # job a page; `next` continues): a page of 1,000 huge specs is not built in memory at once.
    list_page_max_bytes: int = Field(default=4 * 1024 * 1024, ge=1024)
    # How many GET /v1/events of one team this process serves at once; the rest wait their turn.
    audit_reads_per_team: int = Field(default=2, ge=1)
    # How often the read models re-check the log for events the bus has not (yet) delivered.
    catch_up_interval_s: float = Field(default=2.0, gt=0)
    # Unset: "<topic_prefix>.api", so that stacks sharing a broker never share a group.
    consumer_group: str | None = None
    # Worker processes `python -m services.api` starts on the one port (SO_REUSEPORT), and
    # which of them this process is (set by the parent): each worker's read models need every
    # event, so each has a consumer group of its own (`bus_group`).
    api_workers: int = Field(default=1, ge=1, le=64)
    api_worker: int = Field(default=1, ge=1)
    # Where a node's agent serves its ranks' logs (services/agent/log_server.py), a template
    # over the node's `{node}` id and `{hostname}` (one URL: the simulated fleet's one agent);
    # how often a followed log is polled for more output.
    agent_logs_url: str = "http://127.0.0.1:9150"
    agent_logs_timeout_s: float = Field(default=10.0, gt=0)
    logs_poll_s: float = Field(default=0.5, gt=0)
    # How many followed logs and dashboard streams one team may hold open in one API process
    # (services/api/streams.py).
    streams_per_team: int = Field(default=16, ge=1)
    # The limits of a team the admin has set no policy for (PUT /v1/teams/{team}/policy), and
    # of a policy that leaves them out: jobs waiting at once (None: no cap), submissions per
    # second (None: no rate; each request with one costs a database round trip). Past either:
    # 429 with Retry-After. The cap keeps one tenant from flooding the queue for the others.
    team_max_pending_jobs: int | None = Field(default=10_000, ge=0, le=10_000_000)
    team_submissions_per_second: float | None = Field(default=None, gt=0, le=1_000_000)
    # Jobs a second (each job of a batch or an array counted, over `shared_window_s`) a team
    # may submit, alone or not; past it a request waits up to `shared_max_wait_s`, then 429
    # `rate-limited`. None: no such budget (the shared rate below still holds while several
    # teams submit).
    team_jobs_per_second: float | None = Field(default=None, gt=0, le=1_000_000)
    # Jobs a second all teams together may submit while more than one team submits (each job
    # of a batch or an array counts): each team may use what the others leave, never less than
    # an equal share. A request past its team's share waits (at most `shared_max_wait_s`) for
    # room, then gets 429 `fair-share-exceeded` with Retry-After (core/submit_share.py). A team
    # alone is not held by it. The default sits well below what saturates the project's two
    # cores (about 2,500 jobs a second in batches), so that one team's flood leaves the
    # pipeline free for the others' submissions. None: no sharing.
    shared_jobs_per_second: float | None = Field(default=1000.0, gt=0, le=1_000_000)
    shared_max_wait_s: float = Field(default=1.0, ge=0, le=60)
    # Over how long a team's jobs count towards its share and its own jobs a second (the rate
    # times this is the budget); each worker keeps an entry per job submitted within it.
    shared_window_s: float = Field(default=1.0, gt=0, le=3600)
    # Reads (GET, HEAD) one team's tokens may make a second in one API process, a burst of a
    # second's worth; past it 429 with Retry-After (services/api/ratelimit.py). The admin is not
    # bounded. None: no bound. A page costs at most 1,000 jobs, so this bounds a tenant's share
    # of the process's event loop; the default sits above what a client polling in a tight loop
    # makes (a few hundred a second), so only a flood meets it.
    team_reads_per_second: float | None = Field(default=1000.0, gt=0, le=1_000_000)
    # State-changing commands on jobs (hold, release, PATCH, cancel, suspend, resume) one team
    # may make a second across all API processes (each may append to the log every team shares),
    # a burst of a second's worth; past it 429 with Retry-After. None: no bound. The default
    # lets a script cancel or hold an array's elements one by one, and bounds a toggling loop
    # to a hundredth of what the log appends a second.
    team_commands_per_second: float | None = Field(default=200.0, gt=0, le=1_000_000)
    # Look-ups of tokens the read models do not know, per client address (an IPv6 /64) and API
    # process, a second (a second's worth of burst); a good token's costs nothing. Past it 429
    # with Retry-After (services/api/auth_guard.py). None: no bound. A refused token is refused
    # from memory for `auth_refusal_ttl_s` without a look-up.
    auth_failures_per_second: float | None = Field(default=10.0, gt=0, le=1_000_000)
    auth_refusal_ttl_s: float = Field(default=60.0, ge=0, le=86_400)

    @property
    def listen_host(self) -> str:
        return self.api_host or urlsplit(self.api_url).hostname or "127.0.0.1"

    @property
    def listen_port(self) -> int:
        return self.api_port or urlsplit(self.api_url).port or 8080

    @property
    def bus_group(self) -> str:
        group = self.consumer_group or f"{self.topic_prefix}.api"
        return group if self.api_worker == 1 else f"{group}-{self.api_worker}"
