"""The rank sandbox (bubblewrap): a private /tmp, yet the agent's own Python installation
there still runs (a checkout cloned under /tmp, as CI may do, broke every sandboxed rank:
`bwrap: execvp …/.venv/bin/python: No such file or directory`)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import pytest

from services.agent import isolation

needs_bwrap = pytest.mark.skipif(
    not isolation.bwrap_works(),
    reason="bubblewrap is not installed or may not create namespaces on this host",
)


def _sandboxed(
    argv: list[str], work: Path, keep: Sequence[Path] | None = None
) -> subprocess.CompletedProcess[str]:
    wrapped = isolation.bwrap_argv(argv, state_dir=None, binds=[work], workdir=work, keep=keep)
    return subprocess.run(wrapped, capture_output=True, text=True, timeout=60, check=False)


def _checkout_under_tmp(top: Path) -> Path:
    """A checkout at `top` with its own interpreter in .venv, as a fresh clone under /tmp has."""
    (top / ".venv" / "bin").mkdir(parents=True)
    python = top / ".venv" / "bin" / "python"
    os.symlink(os.path.realpath(sys.executable), python)
    (top / "job.py").write_text("print('ran')\n")
    return python


def test_an_installation_under_tmp_is_kept_as_its_top_directory_and_nothing_else() -> None:
    assert isolation.installs_under_tmp([Path("/usr/lib/python3"), Path("/tmp")]) == []
    with tempfile.TemporaryDirectory(dir="/tmp") as top:
        kept = isolation.installs_under_tmp([Path(top) / ".venv", Path("/opt/x")])
        assert kept == [Path(top)]


@needs_bwrap
def test_a_sandboxed_rank_runs_the_agents_installation_under_tmp(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    with tempfile.TemporaryDirectory(dir="/tmp") as top:
        python = _checkout_under_tmp(Path(top))
        keep = isolation.installs_under_tmp([python.parent.parent])
        result = _sandboxed([str(python), f"{top}/job.py"], work, keep)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "ran\n"


@needs_bwrap
def test_the_rest_of_tmp_stays_private_even_when_the_command_names_it(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    with tempfile.TemporaryDirectory(dir="/tmp") as other:
        (Path(other) / "secret").write_text("another job's scratch\n")
        result = _sandboxed(["/bin/cat", f"{other}/secret"], work)
    assert result.returncode != 0
    assert "another job's scratch" not in result.stdout


@needs_bwrap
def test_the_mps_daemon_s_pipes_outside_tmp_are_hidden_from_every_rank_but_a_share(
    tmp_path: Path,
) -> None:
    """Attack: the host's MPS daemon listens in /var/…, outside the private /tmp. The read-only
    root showed its pipes to every rank: a whole-GPU rank naming the directory in its own
    CUDA_MPS_PIPE_DIRECTORY became a client of the daemon and queued other teams' MPS shares
    behind its own server (one user's at a time). Only an MPS share sees them."""
    work = tmp_path / "work"
    work.mkdir()
    with tempfile.TemporaryDirectory(dir="/var/tmp") as pipes:
        (Path(pipes) / "control").write_text("the daemon's control pipe\n")
        agent_env = {"CUDA_MPS_PIPE_DIRECTORY": pipes}
        seen = {}
        for share in (False, True):
            env: dict[str, str] = {}
            binds = isolation.mps_pipes(env, agent_env, share=share)
            wrapped = isolation.bwrap_argv(
                ["/bin/ls", pipes],
                state_dir=None,
                binds=[work, *binds],
                workdir=work,
                hide=isolation.mps_hidden(agent_env, share=share),
            )
            result = subprocess.run(
                wrapped, capture_output=True, text=True, timeout=60, check=False
            )
            assert result.returncode == 0, result.stderr
            seen[share] = result.stdout.split()
    assert seen == {False: [], True: ["control"]}


def test_a_checkpoint_directory_is_made_only_where_no_symlink_leads(tmp_path: Path) -> None:
    # The rank owns its job's checkpoint directory: a symlink it put there in place of a
    # directory would have the agent (root) make, and give the rank, a directory anywhere.
    root = tmp_path / "checkpoints"
    elsewhere = tmp_path / "etc"
    elsewhere.mkdir()
    root.mkdir()
    (root / "job").symlink_to(elsewhere, target_is_directory=True)

    with pytest.raises(OSError):
        isolation.directory_like_parent(root / "job" / "a1-0123", root)

    assert list(elsewhere.iterdir()) == []
    isolation.directory_like_parent(root / "other" / "a1-0123", root)
    assert (root / "other" / "a1-0123").is_dir()
