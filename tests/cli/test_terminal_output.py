"""A rank's output shown on a terminal: what it may and may not do to the reader's screen."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gangway.commands._common import TerminalOutput


def shown(*chunks: bytes) -> bytes:
    terminal = TerminalOutput()
    return b"".join(terminal.write(chunk) for chunk in chunks) + terminal.write(b"", final=True)


def test_lines_tabs_and_utf8_are_shown_as_written() -> None:
    assert shown("step 1\tloss 0.25 ✓ 学习\n".encode()) == "step 1\tloss 0.25 ✓ 学习\n".encode()


def test_escape_sequences_and_carriage_returns_are_spelled_out() -> None:
    # Clear the screen, retitle the terminal, hide a line behind a carriage return.
    output = b"\x1b[2J\x1b]0;pwned\x07ok\rFAKE\n"
    assert shown(output) == b"\\x1b[2J\\x1b]0;pwned\\x07ok\\x0dFAKE\n"


def test_c1_controls_and_bytes_that_are_not_utf8_are_spelled_out() -> None:
    # 0x9b alone is an 8-bit CSI to some terminals; U+009B is the same control as a character.
    assert shown(b"a\x9b2Jb") == b"a\\x9b2Jb"
    assert shown("a\u009b2Jb".encode()) == b"a\\x9b2Jb"


def test_a_character_split_between_chunks_is_shown_whole() -> None:
    encoded = "学".encode()
    assert shown(encoded[:1], encoded[1:]) == encoded


def test_a_character_cut_off_at_the_end_is_spelled_out() -> None:
    assert shown("学".encode()[:2]) == b"\\xe5\\xad"


@given(st.lists(st.binary(max_size=64), max_size=8))
def test_nothing_shown_holds_a_control_character_but_newline_and_tab(chunks: list[bytes]) -> None:
    text = shown(*chunks).decode("utf-8")  # always UTF-8
    controls = {char for char in text if ord(char) < 0x20 or 0x7F <= ord(char) <= 0x9F}
    assert controls <= {"\n", "\t"}


@given(st.text(alphabet=st.characters(blacklist_categories=("Cc", "Cs")) | st.sampled_from("\n\t")))
def test_text_without_controls_is_shown_unchanged(text: str) -> None:
    encoded = text.encode()
    assert shown(encoded[:3], encoded[3:]) == encoded
