"""The chaos suite's own PostgreSQL and Kafka: its own directories and free ports, so that
stopping and restarting them never touches a developer's `make up` stack."""

from __future__ import annotations

import os
import random
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tests.integration.conftest import Stack, kafka_auth

ROOT = Path(__file__).resolve().parents[2]
STACK_SCRIPT = ROOT / "scripts" / "stack.sh"


def ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_ports(count: int, *, rng: random.Random) -> list[int]:
    """`count` loopback ports free now, below the ephemeral range (a server there could find
    its port taken by a reconnecting client while it is down)."""
    low, high = 20_000, ephemeral_low() - 1
    found: list[int] = []
    while len(found) < count:
        port = rng.randint(low, high)
        if port in found:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        found.append(port)
    return found


@dataclass
class ChaosStack:
    directory: Path
    pg_port: int
    kafka_port: int
    controller_port: int

    @classmethod
    def create(cls, directory: Path, rng: random.Random) -> ChaosStack:
        pg, kafka, controller = free_ports(3, rng=rng)
        return cls(directory, pg, kafka, controller)

    def env(self) -> dict[str, str]:
        env = {
            key: value
            for key, value in os.environ.items()
            # Another stack's servers and credentials are not this one's.
            if key not in ("GANGWAY_PG_DSN", "GANGWAY_PG_OWNER_DSN")
            and not key.startswith("GANGWAY_KAFKA_")
        }
        env.update(
            GANGWAY_STACK_DIR=str(self.directory / "stack"),
            GANGWAY_STACK_STATE_DIR=str(self.directory / "gangway"),
            GANGWAY_STACK_PG_PORT=str(self.pg_port),
            GANGWAY_STACK_KAFKA_PORT=str(self.kafka_port),
            GANGWAY_STACK_KAFKA_CONTROLLER_PORT=str(self.controller_port),
            # A small broker: it shares the machine with everything else.
            GANGWAY_STACK_KAFKA_HEAP="-Xms128m -Xmx512m",
        )
        return env

    def run(self, verb: str) -> None:
        subprocess.run(
            [str(STACK_SCRIPT), verb],
            check=True,
            cwd=ROOT,
            env=self.env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )

    def stack(self) -> Stack:
        settings = dict(
            line.split("=", 1)
            for line in subprocess.run(
                [str(STACK_SCRIPT), "env"],
                check=True,
                cwd=ROOT,
                env=self.env(),
                capture_output=True,
                text=True,
            ).stdout.splitlines()
            if "=" in line
        )
        return Stack(
            pg_dsn=settings["GANGWAY_PG_DSN"],
            pg_owner_dsn=settings["GANGWAY_PG_OWNER_DSN"],
            kafka_bootstrap=settings["GANGWAY_KAFKA_BOOTSTRAP"],
            kafka_is_local=True,
            kafka_auth=kafka_auth(settings),
        )
