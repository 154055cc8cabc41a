"""The commands find the checkout's `.gangway/` from any directory inside it, as git finds
`.git/`: a newcomer who `cd`s into `docs/` still reaches their own API with their own token."""

from __future__ import annotations

from pathlib import Path

import pytest

from gangway.client import DEFAULT_API_URL, ClientConfig, ClientError, find_state_dir


def checkout(root: Path, *, api_url: str, token: str) -> Path:
    state = root / ".gangway"
    state.mkdir(parents=True)
    (state / "env").write_text(f"GANGWAY_PG_DSN=postgresql://x@h/db\nGANGWAY_API_URL={api_url}\n")
    (state / "admin.token").write_text(token + "\n")
    return state


def test_a_subdirectory_finds_the_checkouts_api_and_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = checkout(tmp_path, api_url="http://127.0.0.1:18080", token="tok-1")
    deep = tmp_path / "docs" / "figures"
    deep.mkdir(parents=True)
    monkeypatch.chdir(deep)

    assert find_state_dir() == state.resolve()
    config = ClientConfig.load(env={})
    assert config.api_url == "http://127.0.0.1:18080"
    assert config.token == "tok-1"


def test_the_nearest_state_directory_wins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    checkout(tmp_path, api_url="http://outer:1", token="outer")
    inner = checkout(tmp_path / "inner", api_url="http://inner:2", token="inner")
    (tmp_path / "inner" / "src").mkdir()
    monkeypatch.chdir(tmp_path / "inner" / "src")

    assert find_state_dir() == inner.resolve()
    assert ClientConfig.load(env={}).token == "inner"


def test_the_environment_still_overrides_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    checkout(tmp_path, api_url="http://127.0.0.1:18080", token="tok-1")
    monkeypatch.chdir(tmp_path)
    config = ClientConfig.load(env={"GANGWAY_API_URL": "http://elsewhere:9", "GANGWAY_TOKEN": "t"})
    assert (config.api_url, config.token) == ("http://elsewhere:9", "t")


def test_outside_any_checkout_the_defaults_apply(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    if find_state_dir().is_absolute():  # a .gangway/ above pytest's tmp_path: nothing to show
        pytest.skip(f"{find_state_dir()} exists above the test's directory")
    config = ClientConfig.load(env={})
    assert (config.api_url, config.token) == (DEFAULT_API_URL, None)


def test_an_api_url_without_its_scheme_is_named_as_such(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `export GANGWAY_API_URL=127.0.0.1:18180` read "cannot reach the API at 127.0.0.1:18180
    # (UnsupportedProtocol); is it running (make up)?" while it ran.
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ClientError) as raised:
        ClientConfig.load(env={"GANGWAY_API_URL": "127.0.0.1:18180"})
    assert str(raised.value) == (
        "GANGWAY_API_URL '127.0.0.1:18180' is not a URL: it starts with http:// or https:// "
        "(as in http://127.0.0.1:8080)"
    )
