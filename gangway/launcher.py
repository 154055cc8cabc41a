"""Start, watch and stop the Gangway services as background processes.

`make up` / `make down` call the CLI (`python -m gangway.launcher up|down|status`); the e2e
tests use the same `Launcher` from their fixtures with their own environment (a fresh database,
a topic prefix) and their own state directory, so that a test run never touches the processes
`make up` started.

Each service runs detached in its own session (so a Ctrl-C in the shell that ran `make up`
does not reach it), logs to `<state>/logs/<name>.log` and is remembered by
`<state>/pids/<name>.pid`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from services.runtime.bus_acl import ROLES, password_variable

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_STATE_DIR = REPO_ROOT / ".gangway"
DEFAULT_CLUSTER = "16x8:4:2"
DEFAULT_API_URL = "http://127.0.0.1:8080"
# Metrics ports of `make up`: base + the service's place in the table (the API serves its own).
DEFAULT_METRICS_PORT_BASE = 9100
# How long `launcher up` waits for PostgreSQL and Kafka (GANGWAY_LAUNCHER_WAIT_S).
DEFAULT_DEPENDENCY_WAIT_S = 60.0
# `make up` starts an API worker per this many cores, unless GANGWAY_API_WORKERS says.
CORES_PER_API_WORKER = 4
# The agent's log endpoint: base + this (9150 by default, the agent's and the API's default).
AGENT_LOG_PORT_OFFSET = 50


class LauncherError(RuntimeError):
    """A service would not start or become ready; the message says which and where to look."""


@dataclass(frozen=True, slots=True)
class ServiceSpec:
    """One background process: how to run it and how to tell that it is ready.

    Readiness, first that applies: `ready_url` answers 200; `ready_log` (a regex) appears in
    its log; otherwise the process is still alive `settle_s` after it started.
    """

    name: str
    module: str
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    ready_url: str | None = None
    ready_log: str | None = None
    settle_s: float = 1.0
    # Its principal on an authenticating broker (services/runtime/bus_acl.py ROLES).
    bus_role: str = "service"

    def argv(self, python: str) -> list[str]:
        return [python, "-m", self.module, *self.args]

    def buildable(self) -> bool:
        """Whether its entry point exists in this checkout (a module, or a package with a
        `__main__`)."""
        try:
            spec = importlib.util.find_spec(self.module)
            if spec is None:
                return False
            if spec.submodule_search_locations is None:
                return True
            return importlib.util.find_spec(f"{self.module}.__main__") is not None
        except ModuleNotFoundError:
            return False


def default_services(
    *,
    cluster: str = DEFAULT_CLUSTER,
    api_url: str = DEFAULT_API_URL,
    scheduler_replicas: int = 2,
    metrics_port_base: int | None = DEFAULT_METRICS_PORT_BASE,
    api_workers: int = 1,
) -> list[ServiceSpec]:
    """The whole system in start order: relay and consumers first, the fleet, then the API.

    `metrics_port_base` None gives every process an ephemeral metrics port (tests run beside
    `make up` on one machine); otherwise each gets base + its index. `api_workers` API
    processes share the API's port (services/api/__main__.py).
    """
    names = ["relay", "admission"]
    names += ["scheduler"] + [f"scheduler-{i}" for i in range(2, scheduler_replicas + 1)]
    # The fleet before the API: the API's readiness waits on its read models, and nodes
    # should be heard from soon after the inventory starts counting their silence.
    names += ["inventory", "health", "checkpoint", "agent", "api"]

    # The agent serves its ranks' logs to the API (services/agent/log_server.py) on this port.
    log_port = (
        free_port() if metrics_port_base is None else metrics_port_base + AGENT_LOG_PORT_OFFSET
    )

    def metrics(index: int) -> dict[str, str]:
        port = 0 if metrics_port_base is None else metrics_port_base + index
        return {"GANGWAY_METRICS_PORT": str(port)}

    specs: list[ServiceSpec] = []
    for index, name in enumerate(names):
        env = {"GANGWAY_SERVICE_NAME": name.split("-")[0], **metrics(index)}
        if name == "relay":
            specs.append(ServiceSpec(name, "services.runtime.relay", env=env, bus_role="relay"))
        elif name.startswith("scheduler"):
            # Every replica runs the same code; the one holding the leader lock acts, the
            # others wait on it (see services/runtime/leadership.py).
            env["GANGWAY_INSTANCE_ID"] = name
            specs.append(ServiceSpec(name, "services.scheduler", env=env))
        elif name == "api":
            env["GANGWAY_AGENT_LOGS_URL"] = f"http://127.0.0.1:{log_port}"
            env["GANGWAY_API_WORKERS"] = str(api_workers)
            specs.append(ServiceSpec(name, "services.api", env=env, ready_url=f"{api_url}/readyz"))
        elif name == "agent":
            env["GANGWAY_LOG_PORT"] = str(log_port)
            specs.append(
                ServiceSpec(
                    name,
                    "services.agent",
                    args=("--cluster", cluster),
                    env=env,
                    ready_log=r"\bagent ready\b",
                    bus_role="agent",
                )
            )
        elif name == "inventory":
            # The same cluster as the fleet's, whatever GANGWAY_CLUSTER says.
            env["GANGWAY_CLUSTER"] = cluster
            specs.append(
                ServiceSpec(name, "services.inventory", env=env, ready_log=r"\binventory ready\b")
            )
        elif name in ("health", "checkpoint"):
            specs.append(
                ServiceSpec(name, f"services.{name}", env=env, ready_log=rf"\b{name} ready\b")
            )
        else:
            specs.append(ServiceSpec(name, f"services.{name}", env=env))
    return specs


@dataclass(frozen=True, slots=True)
class Started:
    name: str
    pid: int
    already_running: bool


class Launcher:
    """Runs services under `state_dir` with `env` laid over this process's environment.

    `supervise`: each service runs under gangway.supervisor, which starts it again whenever it
    exits (`make up` does); its pid file then names the supervisor, and `kill` signals the
    service itself.
    """

    def __init__(
        self,
        *,
        state_dir: Path = DEFAULT_STATE_DIR,
        env: Mapping[str, str] | None = None,
        root: Path = REPO_ROOT,
        python: str = sys.executable,
        supervise: bool = False,
    ) -> None:
        self.state_dir = state_dir
        self.root = root
        self.python = python
        self.supervise = supervise
        self.env = dict(env or {})
        self.logs_dir = state_dir / "logs"
        self.pids_dir = state_dir / "pids"
        self._children: dict[str, subprocess.Popen[bytes]] = {}

    # ------------------------------------------------------------------ paths and state

    def log_path(self, name: str) -> Path:
        return self.logs_dir / f"{name}.log"

    def pid_path(self, name: str) -> Path:
        return self.pids_dir / f"{name}.pid"

    def child_pid_path(self, name: str) -> Path:
        """Where a supervised service's own pid is kept (its supervisor's is in pid_path)."""
        return self.pids_dir / f"{name}.child"

    def service_pid(self, name: str) -> int | None:
        """The pid of the service's own process: the supervisor's child when supervised."""
        pid = self.pid(name)
        if pid is None:
            return None
        try:
            child = int(self.child_pid_path(name).read_text().strip())
        except (FileNotFoundError, ValueError):
            return pid
        return child if _alive(child) else pid

    def read_log(self, name: str) -> str:
        try:
            return self.log_path(name).read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def pid(self, name: str) -> int | None:
        """The pid of the running service `name`, or None (a stale pid file is removed)."""
        path = self.pid_path(name)
        try:
            # "<pid>\n<module>\n": the module lets a later launcher recognise its process.
            pid_text, _, module = path.read_text().partition("\n")
            pid = int(pid_text.strip())
        except (FileNotFoundError, ValueError):
            return None
        child = self._children.get(name)
        if child is not None and child.pid == pid:
            # Started by this launcher: ask the child itself. (Its /proc cmdline is still this
            # process's until the exec, so the check below would misjudge a fresh child.)
            if child.poll() is None:
                return pid
        elif _alive(pid) and _runs_module(pid, module.strip()):
            return pid
        path.unlink(missing_ok=True)
        return None

    def running(self) -> dict[str, int]:
        """Every service with a live pid file, by name."""
        if not self.pids_dir.is_dir():
            return {}
        found = {}
        for path in sorted(self.pids_dir.glob("*.pid")):
            pid = self.pid(path.stem)
            if pid is not None:
                found[path.stem] = pid
        return found

    # ------------------------------------------------------------------ start

    def child_env(self, spec: ServiceSpec) -> dict[str, str]:
        env = bus_credentials({**os.environ, **self.env, **spec.env}, spec.bus_role)
        env.setdefault("PYTHONUNBUFFERED", "1")
        return env

    def start(self, spec: ServiceSpec) -> Started:
        """Start `spec` unless it already runs (idempotent); does not wait for readiness."""
        existing = self.pid(spec.name)
        if existing is not None:
            return Started(spec.name, existing, already_running=True)
        self._stop_orphan(spec)
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        self.pids_dir.mkdir(parents=True, exist_ok=True)
        with self.log_path(spec.name).open("ab") as log:
            log.write(f"\n=== {time.strftime('%Y-%m-%dT%H:%M:%S')} starting {spec.name}\n".encode())
            log.flush()
            argv = spec.argv(self.python)
            if self.supervise:
                argv = [
                    self.python,
                    "-m",
                    "gangway.supervisor",
                    "--name",
                    spec.name,
                    "--child-pid-file",
                    str(self.child_pid_path(spec.name)),
                    "--",
                    *argv,
                ]
            self.child_pid_path(spec.name).unlink(missing_ok=True)
            process = subprocess.Popen(
                argv,
                cwd=self.root,
                env=self.child_env(spec),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self._children[spec.name] = process
        _write_atomic(self.pid_path(spec.name), f"{process.pid}\n{spec.module}\n")
        return Started(spec.name, process.pid, already_running=False)

    def _stop_orphan(self, spec: ServiceSpec, timeout_s: float = 15.0) -> None:
        """A supervised service whose supervisor was killed (`kill -9` of its pid) runs on,
        unsupervised: started again beside it, there would be two (two admissions in one
        group; two agents launching the same ranks), and the first forgotten by `down`. It is
        stopped first, as `stop` would (SIGTERM, then SIGKILL)."""
        try:
            orphan = int(self.child_pid_path(spec.name).read_text().split()[0])
        except (FileNotFoundError, ValueError, IndexError):
            return
        if not (_alive(orphan) and _runs_module(orphan, spec.module)):
            return
        print(
            f"[launcher] {spec.name}: its supervisor is gone but it runs (pid {orphan}); "
            "stopping it before starting it again",
            file=sys.stderr,
        )
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(orphan, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while _alive(orphan) and _runs_module(orphan, spec.module):
            if time.monotonic() >= deadline:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(orphan, signal.SIGKILL)
                break
            time.sleep(0.1)

    def wait_ready(self, spec: ServiceSpec, *, timeout_s: float = 60.0, since: int = 0) -> None:
        """Block until `spec` is ready; raise LauncherError if it dies or the time runs out.

        `since` is the log offset where this start's output begins, so that a ready line of an
        earlier run does not count.
        """
        deadline = time.monotonic() + timeout_s
        started = time.monotonic()
        pattern = re.compile(spec.ready_log, re.IGNORECASE) if spec.ready_log else None
        while True:
            if self.pid(spec.name) is None:
                raise LauncherError(
                    f"{spec.name} exited while starting; its log ({self.log_path(spec.name)}) "
                    f"ends with:\n{_tail(self.read_log(spec.name))}"
                )
            if spec.ready_url is not None:
                if _http_ok(spec.ready_url):
                    return
            elif pattern is not None:
                if pattern.search(self.read_log(spec.name)[since:]):
                    return
            elif time.monotonic() - started >= spec.settle_s:
                return
            if time.monotonic() > deadline:
                raise LauncherError(
                    f"{spec.name} not ready after {timeout_s:.0f} s; its log "
                    f"({self.log_path(spec.name)}) ends with:\n{_tail(self.read_log(spec.name))}"
                )
            time.sleep(0.2)

    def up(
        self, specs: Sequence[ServiceSpec], *, timeout_s: float = 90.0, skip_missing: bool = False
    ) -> list[Started]:
        """Start every spec in order, each ready before the next starts; leave running ones be."""
        results = []
        for spec in specs:
            if skip_missing and not spec.buildable():
                print(
                    f"[launcher] {spec.name}: {spec.module} has no entry point yet; skipped",
                    file=sys.stderr,
                )
                continue
            offset = len(self.read_log(spec.name))
            started = self.start(spec)
            if not started.already_running:
                self.wait_ready(spec, timeout_s=timeout_s, since=offset)
            results.append(started)
        return results

    # ------------------------------------------------------------------ stop

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Send `sig` to the service's process (tests: crash a scheduler, pause an agent);
        a supervised service that dies of it is started again."""
        pid = self.service_pid(name)
        if pid is None:
            raise LauncherError(f"{name} is not running")
        os.kill(pid, sig)

    def stop(self, name: str, *, timeout_s: float = 15.0) -> bool:
        """SIGTERM the service's process group, SIGKILL it after `timeout_s`; True if it ran."""
        pid = self.pid(name)
        if pid is None:
            return False
        if self.supervise:
            # The supervisor passes it on to the service (once: a second SIGTERM would cut
            # the service's graceful stop short) and does not restart it.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGTERM)
        else:
            _signal_group(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if _alive(pid):
            print(
                f"[launcher] {name} ignored SIGTERM for {timeout_s:.0f} s; killing it",
                file=sys.stderr,
            )
        # The group too: a child left behind (a rank of a killed agent) must not outlive it.
        _signal_group(pid, signal.SIGKILL)
        child = self._children.pop(name, None)
        if child is not None:
            child.wait()
        self.pid_path(name).unlink(missing_ok=True)
        self.child_pid_path(name).unlink(missing_ok=True)
        return True

    def down(self, order: Iterable[str] = (), *, timeout_s: float = 15.0) -> list[str]:
        """Stop every running service: those named in `order` first (reverse start order)."""
        running = self.running()
        names = [n for n in order if n in running] + [n for n in running if n not in order]
        return [name for name in names if self.stop(name, timeout_s=timeout_s)]


# ---------------------------------------------------------------------- make up / make down


def bus_credentials(env: dict[str, str], role: str) -> dict[str, str]:
    """`env` with the broker principal of `role` as the process's own: a service gets its
    role's name and password (GANGWAY_KAFKA_USERNAME/PASSWORD) in place of the admin's, and
    none of the other roles' passwords. Unchanged where no role password is given (a broker
    without authentication, or one external principal for all)."""
    passwords = {r: env.pop(password_variable(r), None) for r in ROLES}
    if not any(passwords.values()):
        return env
    password = passwords.get(role)
    if password is None:
        raise LauncherError(f"no broker password for the role {role!r} ({password_variable(role)})")
    env["GANGWAY_KAFKA_USERNAME"] = ROLES[role]
    env["GANGWAY_KAFKA_PASSWORD"] = password
    return env


def ensure_admin_token(path: Path, given: str | None = None) -> str:
    """The admin token in `path` (mode 0600): `given` (GANGWAY_ADMIN_TOKEN) when set, so the
    file and the API agree; else the file's, generated (256 random bits) when absent."""
    try:
        token = path.read_text().strip()
    except FileNotFoundError:
        token = ""
    if token and (not given or given == token):
        return token
    token = given or secrets.token_urlsafe(32)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(token + "\n")
    os.replace(tmp, path)
    return token


def write_env_file(path: Path, values: Mapping[str, str]) -> None:
    """Set `values` in the KEY=value file `path`, keeping the other lines as they are."""
    lines: list[str] = []
    with contextlib.suppress(FileNotFoundError):
        lines = path.read_text().splitlines()
    seen: set[str] = set()
    out = []
    for line in lines:
        key = line.split("=", 1)[0]
        if key in values:
            out.append(f"{key}={values[key]}")
            seen.add(key)
        else:
            out.append(line)
    out += [f"{key}={value}" for key, value in values.items() if key not in seen]
    _write_atomic(path, "\n".join(out) + "\n")


def read_env_file(path: Path) -> dict[str, str]:
    values = {}
    with contextlib.suppress(FileNotFoundError):
        for line in path.read_text().splitlines():
            if "=" in line and not line.lstrip().startswith("#"):
                key, value = line.split("=", 1)
                values[key.strip()] = value.strip()
    return values


async def registered_node_count(dsn: str) -> int:
    """How many nodes the log holds a registration for."""
    import asyncpg

    conn = await asyncpg.connect(dsn)
    try:
        count = await conn.fetchval(
            "SELECT count(DISTINCT stream) FROM events WHERE type = 'NodeRegistered'"
        )
        return int(count)
    finally:
        await conn.close()


async def wait_for_nodes(dsn: str, count: int, *, timeout_s: float = 120.0) -> int:
    """Wait until at least `count` nodes are registered in the log; return how many are."""
    deadline = time.monotonic() + timeout_s
    seen = 0
    while True:
        with contextlib.suppress(OSError):
            seen = await registered_node_count(dsn)
        if seen >= count:
            return seen
        if time.monotonic() > deadline:
            raise LauncherError(f"only {seen} of {count} nodes registered after {timeout_s:.0f} s")
        await asyncio.sleep(0.5)


def _cluster_node_count(cluster: str, root: Path) -> int:
    from core.topology import parse_cluster_spec

    path = root / cluster if not Path(cluster).is_absolute() else Path(cluster)
    text = path.read_text() if path.is_file() else cluster
    return len(parse_cluster_spec(text))


def api_workers() -> int:
    """The API processes `make up` starts: GANGWAY_API_WORKERS, else one per CORES_PER_API_WORKER
    cores, at least one. Each worker keeps read models of its own (every event folded once per
    worker), so a second one pays only where cores are left over beside PostgreSQL, Kafka and
    the other services: on the project's 2-core machine it raised the API's CPU per job from
    1.5 to 2.7 ms (docs/benchmarks.md)."""
    configured = os.environ.get("GANGWAY_API_WORKERS")
    if configured:
        return max(1, int(configured))
    return max(1, (os.cpu_count() or 1) // CORES_PER_API_WORKER)


def service_order(specs: Sequence[ServiceSpec]) -> list[str]:
    """The order to stop them in: the API and the fleet first, the relay last (so the fleet's
    last TaskExited events still reach the bus)."""
    return [spec.name for spec in reversed(specs)]


def wait_for_dependency(
    what: str,
    attempt: Callable[[], Coroutine[Any, Any, object]],
    transient: tuple[type[BaseException], ...],
    wait_s: float,
    *,
    sleep: Callable[[float], None] = time.sleep,
) -> bool:
    """`attempt()` until it passes, for up to `wait_s` while `what` is unreachable (as the
    services wait for it): one line when it starts waiting and one when it gives up, never a
    traceback (before, `launcher up` with PostgreSQL down died in the migrations with one)."""
    deadline = time.monotonic() + wait_s
    waiting = False
    while True:
        try:
            asyncio.run(attempt())
        except transient as error:
            if time.monotonic() >= deadline:
                print(
                    f"[launcher] error: {what} is unreachable ({error!r}); start it "
                    "(scripts/stack.sh up) and run this again",
                    file=sys.stderr,
                )
                return False
            if not waiting:
                print(
                    f"[launcher] {what} is unreachable ({error!r}); waiting up to {wait_s:g} s",
                    file=sys.stderr,
                )
                waiting = True
            sleep(1.0)
            continue
        if waiting:
            print(f"[launcher] {what} is back", file=sys.stderr)
        return True


def metrics_port_base(environ: Mapping[str, str], file_env: Mapping[str, str]) -> int:
    """Where the services' metrics ports (and the agent's log port, base + 50) start: the
    environment's GANGWAY_METRICS_PORT_BASE (a second installation on one machine moves them),
    else the one this checkout's last `make up` used (kept in `.gangway/env`, as the API's URL
    is), else 9100. A later `make up` from a shell without the variable once put a restarted
    service on the first installation's ports, its agent's log port included."""
    value = environ.get("GANGWAY_METRICS_PORT_BASE") or file_env.get("GANGWAY_METRICS_PORT_BASE")
    return int(value) if value else DEFAULT_METRICS_PORT_BASE


def cmd_up(launcher: Launcher) -> int:
    from services.runtime.migrate import migrate_settings
    from services.runtime.settings import Settings
    from services.runtime.topics import ensure_topics

    env_file = launcher.state_dir / "env"
    settings = Settings()
    cluster = os.environ.get("GANGWAY_CLUSTER", DEFAULT_CLUSTER)
    api_url = settings.api_url
    print("[launcher] applying the migrations", file=sys.stderr)
    from services.runtime.errors import DATABASE_UNAVAILABLE

    wait_s = float(os.environ.get("GANGWAY_LAUNCHER_WAIT_S") or DEFAULT_DEPENDENCY_WAIT_S)
    if not wait_for_dependency(
        "PostgreSQL", lambda: migrate_settings(settings), DATABASE_UNAVAILABLE, wait_s
    ):
        return 1
    token_file = launcher.state_dir / "admin.token"
    ensure_admin_token(token_file, os.environ.get("GANGWAY_ADMIN_TOKEN") or None)
    base = metrics_port_base(os.environ, read_env_file(env_file))
    specs = default_services(
        cluster=cluster, api_url=api_url, metrics_port_base=base, api_workers=api_workers()
    )
    connection = {
        "GANGWAY_PG_DSN": settings.pg_dsn,
        "GANGWAY_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
        "GANGWAY_API_URL": api_url,
        "GANGWAY_METRICS_PORT_BASE": str(base),
    }
    monitor = prometheus_service(specs, os.environ)
    if monitor is not None:
        specs.append(monitor)
        connection["GANGWAY_PROMETHEUS_URL"] = f"http://{monitor.env['GANGWAY_PROMETHEUS_ADDRESS']}"
    write_env_file(env_file, connection)
    launcher.env.setdefault("GANGWAY_ADMIN_TOKEN_FILE", str(token_file))
    # The key the relay signs the bus's records with (services/runtime/signing.py): one per
    # installation, kept across runs (running services keep checking with it), mode 0600.
    launcher.env.setdefault(
        "GANGWAY_BUS_KEY",
        ensure_admin_token(launcher.state_dir / "bus.key", os.environ.get("GANGWAY_BUS_KEY")),
    )
    launcher.env.setdefault("GANGWAY_CLUSTER", cluster)
    # Each service's broker principal (scripts/stack.sh wrote the roles' passwords there).
    for role in ROLES:
        variable = password_variable(role)
        value = os.environ.get(variable) or read_env_file(env_file).get(variable)
        if value:
            launcher.env.setdefault(variable, value)
    # The topics and the roles' rights on them, made as the admin: services may do neither.
    from aiokafka.errors import KafkaError

    if not wait_for_dependency(
        "Kafka", lambda: ensure_topics(settings), (OSError, TimeoutError, KafkaError), wait_s
    ):
        return 1
    try:
        for started in launcher.up(specs, skip_missing=True):
            state = "already running" if started.already_running else "started"
            print(f"[launcher] {started.name}: {state} (pid {started.pid})", file=sys.stderr)
        nodes = _cluster_node_count(cluster, launcher.root)
        if any(spec.name == "inventory" and spec.buildable() for spec in specs):
            seen = asyncio.run(wait_for_nodes(settings.pg_dsn, nodes))
            print(f"[launcher] {seen} nodes registered ({cluster})", file=sys.stderr)
    except LauncherError as error:
        print(f"[launcher] error: {error}", file=sys.stderr)
        return 1
    print(f"API and dashboard: {api_url}")
    if monitor is not None:
        print(f"Prometheus: {connection['GANGWAY_PROMETHEUS_URL']}")
    print(f"admin token: {token_file}")
    return 0


def prometheus_service(
    specs: Sequence[ServiceSpec], environ: Mapping[str, str]
) -> ServiceSpec | None:
    """The local Prometheus scraping every service (gangway/prometheus.py), unless
    GANGWAY_PROMETHEUS=0 or the distribution's package is not installed."""
    from gangway import prometheus

    if environ.get("GANGWAY_PROMETHEUS", "1") == "0":
        return None
    if prometheus.binary() is None:
        print(
            "[launcher] prometheus: not installed (apt-get install prometheus); skipped",
            file=sys.stderr,
        )
        return None
    address = environ.get("GANGWAY_PROMETHEUS_ADDRESS") or prometheus.DEFAULT_ADDRESS
    targets = ",".join(
        f"{spec.name}=127.0.0.1:{spec.env['GANGWAY_METRICS_PORT']}"
        for spec in specs
        # The API serves /metrics on its own port (scraped through GANGWAY_API_URL).
        if spec.name != "api" and spec.env.get("GANGWAY_METRICS_PORT", "0") != "0"
    )
    return ServiceSpec(
        "prometheus",
        "gangway.prometheus",
        env={"GANGWAY_PROMETHEUS_TARGETS": targets, "GANGWAY_PROMETHEUS_ADDRESS": address},
        ready_url=f"http://{address}/-/ready",
    )


def cmd_down(launcher: Launcher) -> int:
    stopped = launcher.down(service_order(default_services()))
    for name in stopped:
        print(f"[launcher] stopped {name}", file=sys.stderr)
    return 0


def cmd_status(launcher: Launcher) -> int:
    running = launcher.running()
    for spec in default_services():
        pid = running.pop(spec.name, None)
        print(f"{spec.name}: " + (f"running (pid {pid})" if pid else "stopped"))
    for name, pid in running.items():
        print(f"{name}: running (pid {pid})")
    prometheus_url = read_env_file(launcher.state_dir / "env").get("GANGWAY_PROMETHEUS_URL")
    if prometheus_url:
        print(f"prometheus URL: {prometheus_url}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gangway.launcher")
    parser.add_argument("command", choices=["up", "down", "status"])
    parser.add_argument("--state-dir", type=Path, default=DEFAULT_STATE_DIR)
    args = parser.parse_args(argv)
    # Supervised: a service that exits (it should not, even across outages) is started again.
    launcher = Launcher(state_dir=args.state_dir, supervise=True)
    commands = {"up": cmd_up, "down": cmd_down, "status": cmd_status}
    return commands[args.command](launcher)


# ---------------------------------------------------------------------- helpers


def free_port() -> int:
    """A TCP port free on loopback now (for a test's API or metrics endpoint)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child of this process is dead for our purposes: reap it.
    with contextlib.suppress(ChildProcessError):
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return False
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state != "Z"


def _runs_module(pid: int, module: str) -> bool:
    """Whether `pid` runs `python -m module`: a pid is reused after its process died, and a
    pid file must never make the launcher signal a stranger."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return True  # no /proc: give the pid file the benefit of the doubt
    if not module:
        return any(part.startswith((b"services.", b"gangway.")) for part in cmdline)
    return module.encode() in cmdline


def _signal_group(pid: int, sig: int) -> None:
    """Signal the service's process group (it leads one), or the process alone when it has no
    group of its own. Never both: a service takes a second SIGTERM as "exit now", skipping
    its graceful stop (a leader's last snapshot), and two signals sent back to back may
    arrive as two."""
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def _http_ok(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2.0).status_code == 200
    except httpx.HTTPError:
        return False


def _tail(text: str, lines: int = 30) -> str:
    return "\n".join(text.splitlines()[-lines:])


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    # Every file the launcher writes may hold a secret (.gangway/env holds DSNs): its owner's
    # only, from the first byte.
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    os.replace(tmp, path)


if __name__ == "__main__":
    raise SystemExit(main())
