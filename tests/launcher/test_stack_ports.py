"""scripts/stack.sh refuses a server port inside Linux's ephemeral port range."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


@pytest.mark.skipif(not RANGE.exists(), reason="no Linux ephemeral port range to check against")
@pytest.mark.parametrize("variable", ["GANGWAY_STACK_PG_PORT", "GANGWAY_STACK_KAFKA_PORT"])
def test_a_server_port_inside_the_ephemeral_range_is_refused_with_a_clear_message(
    tmp_path: Path, variable: str
) -> None:
    low, high = (int(part) for part in RANGE.read_text().split())
    # A copy, so that whatever happens runs in a scratch tree, never the real stack.
    (tmp_path / "scripts").mkdir()
    script = tmp_path / "scripts" / "stack.sh"
    shutil.copy(ROOT / "scripts" / "stack.sh", script)
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("GANGWAY_PG_DSN", "GANGWAY_KAFKA_BOOTSTRAP")
    }
    env[variable] = str((low + high) // 2)
    result = subprocess.run(
        [str(script), "up"], env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode != 0
    assert "ephemeral port range" in result.stderr
    assert env[variable] in result.stderr
    assert not (tmp_path / ".stack" / "pg" / "data").exists()


def test_the_default_ports_lie_below_the_ephemeral_range() -> None:
    text = (ROOT / "scripts" / "stack.sh").read_text()
    for default in (25432, 29092, 29093):
        assert f":-{default}}}" in text
    low = int(RANGE.read_text().split()[0]) if RANGE.exists() else 32768
    assert max(25432, 29092, 29093, 8080, 9100 + 10) < low


def test_up_keeps_the_lines_of_the_env_file_it_does_not_write(tmp_path: Path) -> None:
    # attack5: `make test` after `make up` runs `scripts/stack.sh up`, which wrote .gangway/env
    # anew: the launcher's GANGWAY_PROMETHEUS_URL (DESIGN §8) was gone, and the API's URL given
    # to `make up` became the default, so the CLI spoke to whatever listens on 8080.
    (tmp_path / "scripts").mkdir()
    script = tmp_path / "scripts" / "stack.sh"
    shutil.copy(ROOT / "scripts" / "stack.sh", script)
    state = tmp_path / ".gangway"
    state.mkdir()
    (state / "env").write_text(
        "GANGWAY_API_URL=http://127.0.0.1:21999\nGANGWAY_PROMETHEUS_URL=http://127.0.0.1:9290\n"
    )
    env = {key: value for key, value in os.environ.items() if not key.startswith("GANGWAY_")}
    # Servers given by the environment: up starts nothing, it only writes the settings.
    env["GANGWAY_PG_DSN"] = "postgresql://app:secret@127.0.0.1:1/gangway"
    env["GANGWAY_KAFKA_BOOTSTRAP"] = "127.0.0.1:2"

    subprocess.run([str(script), "up"], env=env, check=True, capture_output=True, timeout=60)

    lines = (state / "env").read_text().splitlines()
    assert "GANGWAY_PROMETHEUS_URL=http://127.0.0.1:9290" in lines
    assert "GANGWAY_API_URL=http://127.0.0.1:21999" in lines
    assert "GANGWAY_PG_DSN=postgresql://app:secret@127.0.0.1:1/gangway" in lines
    assert len(lines) == len(set(lines))
