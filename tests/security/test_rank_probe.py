"""A rank probe: a job whose command tries what a hostile tenant's would, and writes what it
could do into its log. Every attempt must be refused. A check the host cannot enforce (the
agent not running as root, no bubblewrap) is skipped with the reason printed, never hidden."""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

from gangway.launcher import ensure_admin_token, write_env_file
from schemas.envelope import EventEnvelope
from schemas.jobs import GangReserved, JobSpec, JobSubmitted, RankPlacement, TaskExited
from services.agent import isolation
from services.agent.agent import Agent
from services.agent.settings import AgentSettings
from services.runtime import EventStore, Settings
from services.runtime.discovery import load_cluster_spec
from tests.integration.support import wait_until

pytestmark = pytest.mark.integration

NODES = load_cluster_spec("2x8")

# Each line of the probe's log: "<check> ALLOWED" or "<check> refused".
PROBE = r"""
try() {
    name=$1; shift
    if "$@" >/dev/null 2>&1; then echo "$name ALLOWED"; else echo "$name refused"; fi
}
try admin-token cat "$ADMIN_TOKEN"
try gangway-env cat "$GANGWAY_ENV"
try list-other-jobs sh -c "ls '$STATE/agent' '$STATE/checkpoints' | grep -q victim"
try other-workdir ls "$OTHER_WORKDIR"
try other-work-file cat "$OTHER_WORKDIR/secret.txt"
try other-checkpoint ls "$OTHER_CHECKPOINTS"
try overwrite-checkpoint sh -c "echo x > '$OTHER_CHECKPOINTS/shard.bin'"
try other-environ cat "/proc/$OTHER_PID/environ"
try signal-service kill -0 "$SERVICE_PID"
if command -v psql >/dev/null 2>&1; then
    try owner-dsn env PGCONNECT_TIMEOUT=5 psql "$OWNER_DSN" -tAc "SELECT 1"
else
    echo "owner-dsn untestable"
fi
try write-faults sh -c "echo '{\"silent\": true}' > '$STATE/faults/n0000.json'"
echo "uid $(id -u)"
if grep -q 'gangway/probe-a1-r0' /proc/self/cgroup; then echo "cgroup yes"; fi
echo probe-done
"""


def _guessed(dsn: str) -> str:
    parts = urlsplit(dsn)
    netloc = f"{parts.username}:{parts.username}@{parts.hostname}:{parts.port}"
    return urlunsplit(parts._replace(netloc=netloc))


@pytest.fixture(params=["bwrap", "none"])
async def agent(
    settings: Settings, store: EventStore, tmp_path: Path, request: pytest.FixtureRequest
) -> AsyncIterator[Agent]:
    """The agent as `make up` runs it, with the bubblewrap sandbox and without (the users and
    file modes alone must refuse every attempt too)."""
    if request.param == "bwrap" and not isolation.bwrap_works():
        pytest.skip("bubblewrap is not installed or may not create namespaces on this host")
    state = tmp_path / ".gangway"
    (state / "faults").mkdir(parents=True)
    agent_settings = AgentSettings(
        **{
            **settings.model_dump(),
            "work_dir": state / "agent",
            "checkpoint_root": state / "checkpoints",
            "fault_dir": state / "faults",
            "stop_timeout_s": 2.0,
            "rank_sandbox": request.param,
        },
        _env_file=None,
    )
    running = Agent(agent_settings, store, NODES)
    yield running
    await running.shutdown()


async def _reserve(
    store: EventStore, job_id: str, team: str, node: str, command: list[str], env: dict[str, str]
) -> EventEnvelope:
    spec = JobSpec(name=job_id, team=team, tasks=1, gpus_per_task=8, command=command, env=env)
    await store.append(
        f"job-{job_id}", 0, [JobSubmitted(job_id=job_id, spec=spec, submitted_by="t")]
    )
    gang = GangReserved(
        job_id=job_id, attempt=1, ranks=[RankPlacement(rank=0, node_id=node, gpus=list(range(8)))]
    )
    [envelope] = await store.append(f"job-{job_id}", 1, [gang])
    return envelope


async def _launch(agent: Agent, envelope: EventEnvelope) -> None:
    async with agent.store.pool.acquire() as conn:
        await agent.handlers()["GangReserved"](envelope, conn)
    await agent.launches_done()


async def test_a_hostile_rank_can_read_signal_or_reach_nothing_of_the_control_plane(
    agent: Agent, store: EventStore, settings: Settings, tmp_path: Path
) -> None:
    state = tmp_path / ".gangway"
    # The control plane's secrets, written by the launcher's own functions.
    token = state / "admin.token"
    ensure_admin_token(token)
    env_file = state / "env"
    write_env_file(env_file, {"GANGWAY_PG_OWNER_DSN": settings.migration_dsn})

    # Another team's job: a rank with a secret in its environment and files of its own.
    other = await _reserve(
        store,
        "victim",
        "vision",
        "n0001",
        ["sh", "-c", "echo s3cret > secret.txt; exec sleep 600"],
        {"HF_TOKEN": "victim-secret"},
    )
    await _launch(agent, other)
    [victim] = [r for r in agent.ranks.values() if r.key.job_id == "victim"]
    other_checkpoints = agent.root_dir / "victim"
    (other_checkpoints / "shard.bin").write_bytes(b"weights")

    probe_env = {
        "ADMIN_TOKEN": str(token),
        "GANGWAY_ENV": str(env_file),
        "STATE": str(state),
        "OTHER_WORKDIR": str(victim.workdir),
        "OTHER_CHECKPOINTS": str(other_checkpoints),
        "OTHER_PID": str(victim.pid),
        "SERVICE_PID": str(os.getpid()),
        # What a tenant can know of the owner's DSN: the address, the role's name and the
        # password this repository used to hard-code (the real one is random, in files it
        # cannot read).
        "OWNER_DSN": _guessed(settings.migration_dsn),
    }
    probe = await _reserve(store, "probe", "ml", "n0000", ["sh", "-c", PROBE], probe_env)
    await _launch(agent, probe)

    async def probe_exited() -> bool:
        return any(isinstance(e.payload, TaskExited) for e in await store.read_stream("job-probe"))

    await wait_until(probe_exited, what="the probe finished")
    log = (agent.work_dir / "probe" / "a1" / "rank-0" / "rank.log").read_text()
    assert "probe-done" in log, log
    outcome = dict(
        line.split(" ", 1)
        for line in log.splitlines()
        if line.endswith(("ALLOWED", "refused", "untestable"))
    )

    if os.geteuid() != 0:
        pytest.skip(
            "the agent is not root here: ranks run as its own user, so no check of another"
            f" user can be enforced (probe said {outcome})"
        )
    print(f"bubblewrap sandbox: {isolation.bwrap_works()}; cgroups: v{isolation.cgroup_version()}")
    uid = int(next(line.split()[1] for line in log.splitlines() if line.startswith("uid ")))
    assert uid != 0
    assert outcome.pop("uid", None) is None
    if outcome.get("owner-dsn") == "untestable":
        print("psql is not installed: the owner-DSN check could not run")
        del outcome["owner-dsn"]
    else:
        # The server is there and the role logs in with the real password: the refusal is
        # the password's, which no rank can read.
        control = await asyncio.create_subprocess_exec(
            shutil.which("psql") or "psql",
            settings.migration_dsn,
            "-tAc",
            "SELECT 1",
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        _, stderr = await control.communicate()
        assert control.returncode == 0, stderr
    allowed = sorted(name for name, result in outcome.items() if result == "ALLOWED")
    assert allowed == [], f"the probe could: {allowed}\n{log}"
    assert len(outcome) >= 10
    assert (other_checkpoints / "shard.bin").read_bytes() == b"weights"
    assert not (state / "faults" / "n0000.json").exists()
    assert victim.running
    if isolation.cgroup_version() is None:
        print("no cgroup hierarchy on this host: the rank ran without per-job limits")
    else:
        assert "cgroup yes" in log, f"the rank is not in its own cgroup:\n{log}"
    # The probe's own directories are its team's user's alone.
    work = agent.work_dir / "probe"
    assert (work.stat().st_uid, work.stat().st_mode & 0o777) == (uid, 0o700)
    assert (env_file.stat().st_mode & 0o777, token.stat().st_mode & 0o777) == (0o600, 0o600)
