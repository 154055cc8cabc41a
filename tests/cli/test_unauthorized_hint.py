"""A refused token's one line says what to check, by where the token came from."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from gangway.client import ClientConfig, _api_error

UNKNOWN = httpx.Response(401, json={"status": 401, "detail": "unknown token"})


def test_a_refused_token_from_the_environment_is_not_told_to_set_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # It read "unknown token (set GANGWAY_TOKEN, or run make up …)" to someone whose
    # GANGWAY_TOKEN was set, to another installation's token.
    monkeypatch.chdir(tmp_path)
    config = ClientConfig.load(
        env={"GANGWAY_API_URL": "http://127.0.0.1:18180", "GANGWAY_TOKEN": "t"}
    )
    assert str(_api_error(UNKNOWN, config)) == (
        "unknown token (the token from GANGWAY_TOKEN is not one http://127.0.0.1:18180 knows: "
        "mistyped, revoked, or another installation's?)"
    )


def test_a_refused_token_file_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / ".gangway").mkdir()
    (tmp_path / ".gangway" / "admin.token").write_text("old\n")
    monkeypatch.chdir(tmp_path)
    config = ClientConfig.load(env={"GANGWAY_API_URL": "http://127.0.0.1:18180"})
    assert config.token_source is not None and config.token_source.endswith("admin.token")
    assert f"the token from {config.token_source} is not one" in str(_api_error(UNKNOWN, config))


def test_no_token_at_all_is_told_where_one_comes_from() -> None:
    missing = httpx.Response(401, json={"status": 401, "detail": "missing bearer token"})
    config = ClientConfig(api_url="http://127.0.0.1:18180", token=None)
    assert str(_api_error(missing, config)) == (
        "missing bearer token (set GANGWAY_TOKEN, or run make up for .gangway/admin.token)"
    )
