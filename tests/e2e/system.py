"""A whole Gangway system as real processes for one test module: its own database, topic
prefix, API port, admin token and state directory, started with gangway/launcher.py."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from core import Auditor, SchedulingPolicy, Violation
from core.topology import parse_cluster_spec
from gangway.launcher import (
    Launcher,
    ServiceSpec,
    default_services,
    ensure_admin_token,
    free_port,
    service_order,
    wait_for_nodes,
)
from schemas.leadership import LeaderElected
from services.runtime import EventStore, Settings, migrate_settings
from services.runtime.scratch import delete_topics, scratch_database, with_database
from services.runtime.topics import ensure_topics
from tests.integration.conftest import Stack

# A bound for things that take milliseconds to seconds; reaching it means something is broken.
PATIENCE_S = 60.0


@dataclass
class System:
    launcher: Launcher
    specs: dict[str, ServiceSpec]
    settings: Settings
    store: EventStore
    api_url: str
    admin_token: str

    def client(self, token: str | None = None) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            base_url=self.api_url,
            headers={"Authorization": f"Bearer {token or self.admin_token}"},
            timeout=30.0,
        )

    async def create_team(self, name: str, guaranteed_gpus: int) -> str:
        """A team through the admin's REST call, as an operator makes one; its token."""
        async with self.client() as admin:
            created = await admin.post(
                "/v1/teams", json={"name": name, "guaranteed_gpus": guaranteed_gpus}
            )
        assert created.status_code == 201, created.text
        token: str = created.json()["token"]
        return token

    async def leader(self) -> LeaderElected | None:
        """The latest LeaderElected in the log."""
        found = await self.store.read_stream("scheduler")
        last = found[-1].payload if found else None
        return last if isinstance(last, LeaderElected) else None

    async def audit(self) -> tuple[list[Violation], list[str]]:
        """The core's Auditor over the whole log: violations, and admitted jobs that wait
        without a recorded reason (none once the scheduler has caught up)."""
        auditor = Auditor(SchedulingPolicy())
        async for batch in self.store.iter_raw():
            for raw in batch:
                event = self.store.registry.decode(raw.type, raw.schema_version, raw.payload)
                auditor.observe(event, raw.position, raw.recorded_at.timestamp(), raw.epoch)
        return auditor.violations, auditor.unexplained()


async def eventually(
    probe: Callable[[], Awaitable[Any]], *, what: str, patience_s: float = PATIENCE_S
) -> Any:
    """Poll `probe` until it returns something truthy (returned); fail after the deadline."""
    try:
        async with asyncio.timeout(patience_s):
            while True:
                found = await probe()
                if found:
                    return found
                await asyncio.sleep(0.1)
    except TimeoutError:
        raise AssertionError(f"never happened within {patience_s:.0f} s: {what}") from None


@contextlib.asynccontextmanager
async def running_system(
    stack: Stack,
    state_dir: Path,
    *,
    cluster: str,
    scheduler_replicas: int = 2,
    env: Mapping[str, str] | None = None,
    supervise: bool = False,
) -> AsyncIterator[System]:
    """Start relay, admission, schedulers, inventory, health, checkpoint, API and agent fleet;
    yield once the API answers and every node of `cluster` is registered."""
    tag = uuid.uuid4().hex[:10]
    async with scratch_database(stack.pg_owner_dsn, f"gw_e2e_{tag}") as database:
        api_url = f"http://127.0.0.1:{free_port()}"
        settings = Settings(
            pg_dsn=with_database(stack.pg_dsn, database),
            pg_owner_dsn=with_database(stack.pg_owner_dsn, database),
            kafka_bootstrap=stack.kafka_bootstrap,
            **stack.kafka_settings(),
            topic_prefix=f"e2e-{tag}",
            api_url=api_url,
            service_name="e2e-tests",
            _env_file=None,
        )
        await migrate_settings(settings)
        # Topics and the roles' rights on them, as the admin, as `make up` does.
        await ensure_topics(settings)
        token_file = state_dir / "admin.token"
        launcher = Launcher(
            state_dir=state_dir,
            supervise=supervise,
            env={
                "GANGWAY_PG_DSN": settings.pg_dsn,
                "GANGWAY_PG_OWNER_DSN": settings.migration_dsn,
                "GANGWAY_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
                # The admin's and the roles' credentials: each service is given its role's.
                **stack.kafka_auth,
                "GANGWAY_TOPIC_PREFIX": settings.topic_prefix,
                "GANGWAY_API_URL": api_url,
                "GANGWAY_ADMIN_TOKEN_FILE": str(token_file),
                "GANGWAY_CLUSTER": cluster,
                "GANGWAY_WORK_DIR": str(state_dir / "agent"),
                "GANGWAY_CHECKPOINT_ROOT": str(state_dir / "checkpoints"),
                "GANGWAY_FAULT_DIR": str(state_dir / "faults"),
                # A paused leader loses its lock after this long (the failover tests pause one).
                "GANGWAY_SCHEDULER_LOCK_TIMEOUT_S": "3",
                "GANGWAY_SCHEDULER_STANDBY_POLL_S": "0.2",
                **(env or {}),
            },
        )
        specs = default_services(
            cluster=cluster,
            api_url=api_url,
            scheduler_replicas=scheduler_replicas,
            metrics_port_base=None,
        )
        store = await EventStore.connect(settings, producer="e2e-tests")
        try:
            launcher.up(specs, timeout_s=120)
            await wait_for_nodes(settings.pg_dsn, len(parse_cluster_spec(_spec_text(cluster))))
            yield System(
                launcher=launcher,
                specs={spec.name: spec for spec in specs},
                settings=settings,
                store=store,
                api_url=api_url,
                admin_token=ensure_admin_token(token_file),
            )
        finally:
            launcher.down(service_order(specs))
            await store.close()
            with contextlib.suppress(Exception):
                await delete_topics(settings)


def _spec_text(cluster: str) -> str:
    path = Path(cluster)
    return path.read_text() if path.is_file() else cluster
