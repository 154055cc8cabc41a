"""The local broker's files are the stack's own: no other user reads the log from the disk.

The broker's log segments hold every event of every team (job specs with their env and
commands). A rank runs as its team's own user with a read-only view of the host; with the
broker's directory world-readable (the default umask), a rank of one team read another team's
job env from the segments (attack9). scripts/stack.sh keeps the directory 0700.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from tests.integration.conftest import ROOT, Stack

pytestmark = pytest.mark.integration


def broker_dir() -> Path:
    return Path(os.environ.get("GANGWAY_STACK_DIR") or ROOT / ".stack") / "kafka"


def test_no_other_user_enters_the_brokers_directory(stack: Stack) -> None:
    if not stack.kafka_is_local:
        pytest.skip("the broker was given by the environment: its files are not ours")
    directory = broker_dir()
    segments = sorted(directory.glob("data/*/*.log"))
    assert segments, f"no log segment under {directory}"
    assert stat.S_IMODE(directory.stat().st_mode) & 0o077 == 0
    if os.geteuid() != 0 or shutil.which("runuser") is None:
        return
    # As another user (a rank's, here nobody's), through every directory on the way.
    read = subprocess.run(
        ["runuser", "-u", "nobody", "--", "head", "-c", "1", str(segments[0])],
        capture_output=True,
        timeout=30,
    )
    assert read.returncode != 0
    assert b"Permission denied" in read.stderr
