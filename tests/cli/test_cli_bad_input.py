"""What a newcomer gets wrong in a spec file or in the environment is one line on stderr and a
non-zero status, never a traceback, and nothing is sent to the API (none runs here: an
unreachable address proves it)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from gangway.cli import main
from gangway.commands.submit import load_specs

# Nothing listens there: a command that tried to reach it would say so instead.
UNREACHABLE = "http://127.0.0.1:9"

SPEC = "name: x\nteam: nlp\ntasks: 1\ngpus_per_task: 1\n"


@pytest.fixture(autouse=True)
def no_api(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("GANGWAY_API_URL", UNREACHABLE)
    monkeypatch.setenv("GANGWAY_TOKEN", "a-token")
    monkeypatch.chdir(tmp_path)


def one_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert err.startswith("gangway: "), err
    assert err.count("\n") == 1, err
    assert "Traceback" not in err
    return err


@pytest.mark.parametrize(
    ("content", "says"),
    [
        pytest.param(b"name: \xff\xfe\n", "UTF-8", id="not-utf8"),
        pytest.param(
            (SPEC + "estimated_runtime_s: .nan\n").encode(), "estimated_runtime_s", id="nan"
        ),
        pytest.param((SPEC + "max_runtime_s: .inf\n").encode(), "max_runtime_s", id="inf"),
        pytest.param(b"name: &a [*a]\nteam: nlp\n", "refers to itself", id="alias-loop"),
    ],
)
def test_a_spec_file_json_cannot_carry_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes, says: str
) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_bytes(content)
    assert main(["submit", str(spec)]) == 2
    err = one_line(capsys)
    assert says in err and "job.yaml" in err
    assert "cannot reach" not in err


def test_yaml_dates_and_times_stay_the_text_written(tmp_path: Path) -> None:
    """YAML 1.1 reads 2026-01-01 as a date, which JSON has no type for: in a job spec it is
    text (an env value, a name), sent as written."""
    spec = tmp_path / "job.yaml"
    spec.write_text(SPEC + "env: {DAY: 2026-01-01, AT: 2026-01-01 10:00:00}\n")
    [loaded] = load_specs(str(spec))
    assert loaded["env"] == {"DAY": "2026-01-01", "AT": "2026-01-01 10:00:00"}


@pytest.mark.parametrize("token", ["jéton", "two\nlines", "tab\there"])
def test_a_token_no_http_header_can_carry_is_one_line_naming_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], token: str
) -> None:
    monkeypatch.setenv("GANGWAY_TOKEN", token)
    assert main(["jobs"]) == 1
    err = one_line(capsys)
    assert "GANGWAY_TOKEN" in err and "cannot reach" not in err
    assert token not in err  # a token is never echoed, even a broken one


@pytest.mark.parametrize(
    ("content", "key"),
    [
        pytest.param(SPEC + "gpus_per_task: 8\n", "gpus_per_task", id="top-level"),
        pytest.param(SPEC + "env: {A: '1', A: '2'}\n", "A", id="nested"),
        pytest.param(
            SPEC + "---\n" + SPEC.replace("name: x", "name: y") + "team: cv\n",
            "team",
            id="second-document",
        ),
    ],
)
def test_a_key_written_twice_is_refused_in_one_line_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str, key: str
) -> None:
    """The API refuses a JSON body with a key twice (400 duplicate-key); YAML forbids it too.
    Read as PyYAML does by default, the last one silently won: a spec whose two
    `gpus_per_task` lines disagree ran on the GPU count of whichever came last."""
    spec = tmp_path / "job.yaml"
    spec.write_text(content)
    assert main(["submit", str(spec)]) == 2
    err = one_line(capsys)
    assert f"'{key}' appears twice" in err and "cannot reach" not in err


def test_a_merge_key_overridden_is_not_a_key_written_twice(tmp_path: Path) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text(SPEC + "env: {<<: {A: '1', B: '2'}, A: '3'}\n")
    [loaded] = load_specs(str(spec))
    assert loaded["env"] == {"A": "3", "B": "2"}


def test_a_file_of_aliases_expanding_past_any_request_is_refused_at_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A few hundred bytes of nested aliases ("billion laughs") expand to more values than a
    request can carry: the check walked and the client serialised every one of them (9^8
    values: minutes of CPU and gigabytes before the API could refuse it)."""
    lines = ['l0: &l0 ["x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    for level in range(1, 6):
        lines.append(f"l{level}: &l{level} [" + ", ".join([f"*l{level - 1}"] * 9) + "]")
    spec = tmp_path / "job.yaml"
    spec.write_text(SPEC + "\n".join(lines) + "\n")
    assert main(["submit", str(spec)]) == 2
    err = one_line(capsys)
    assert "expands to more than" in err and "cannot reach" not in err


@pytest.mark.parametrize(
    "arguments",
    [
        pytest.param(["top", "--interval", "-1", "-n", "2"], id="interval-negative"),
        pytest.param(["top", "--interval", "nan", "-n", "2"], id="interval-nan"),
        pytest.param(["jobs", "--watch", "--interval", "inf", "-n", "2"], id="interval-inf"),
        pytest.param(["jobs", "--watch", "--interval", "0", "-n", "2"], id="interval-zero"),
        pytest.param(["top", "-n", "-1"], id="iterations-negative"),
        pytest.param(["jobs", "--limit", "-5"], id="jobs-limit-negative"),
        pytest.param(["events", "--limit", "0"], id="events-limit-zero"),
        pytest.param(["events", "--limit", "-3"], id="events-limit-negative"),
        pytest.param(["audit", "--limit", "-1"], id="audit-limit-negative"),
        pytest.param(["events", "-f", "--interval", "-1"], id="events-interval-negative"),
    ],
)
def test_a_count_or_interval_out_of_range_is_refused_before_any_request(
    capsys: pytest.CaptureFixture[str], arguments: list[str]
) -> None:
    """`--interval -1`, `nan` or `inf` ended in time.sleep's traceback after the first
    drawing, `0` redrew (and asked the API) without pause; `--limit -5` listed all but the 5
    oldest jobs, and `events --limit 0` printed one event."""
    with pytest.raises(SystemExit) as exited:
        main(arguments)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "cannot reach" not in err
    assert arguments[-1] in err or arguments[-3] in err


def test_a_spec_file_past_the_size_read_is_refused_unread(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`gangway submit /dev/zero` (or an endless pipe on stdin) read until memory ran out:
    a file is read only up to a bound (made small here), and refused past it."""
    from gangway.commands import submit

    monkeypatch.setattr(submit, "MAX_FILE_BYTES", len(SPEC) + 10)
    spec = tmp_path / "job.yaml"
    spec.write_text(SPEC + "#" * 11)
    assert main(["submit", str(spec)]) == 2
    err = one_line(capsys)
    assert "job.yaml is larger than" in err and "cannot reach" not in err
    spec.write_text(SPEC + "#" * 10)
    assert load_specs(str(spec))[0]["name"] == "x"
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO((SPEC + "#" * 11).encode())))
    assert main(["submit", "-"]) == 2
    assert "standard input is larger than" in one_line(capsys)


@pytest.mark.parametrize("command", ["job", "why", "cancel", "hold", "logs"])
@pytest.mark.parametrize("job_id", ["", ".", ".."])
def test_an_empty_or_dot_id_is_refused_in_one_line_before_any_request(
    capsys: pytest.CaptureFixture[str], command: str, job_id: str
) -> None:
    """attack12: `gangway job ''` printed "gangway: Temporary Redirect" (the request went to
    /v1/jobs/, redirected to the listing), and `gangway job ..` reached /v1/ ("Not Found"):
    a dot segment is no path segment, the client normalised it away."""
    assert main([command, job_id]) != 0
    err = one_line(capsys)
    assert "cannot reach" not in err, err
    assert "not a job id" in err, err


@pytest.mark.parametrize(
    ("content", "says"),
    [
        pytest.param(
            "name: x\n\tteam: nlp\n",
            "found character '\\t' that cannot start any token (line 2, column 1)",
            id="tab",
        ),
        pytest.param(
            "name: x\nteam: nlp\n gpus_per_task: 1\n",
            "mapping values are not allowed here (line 3, column 15)",
            id="indent",
        ),
        pytest.param(
            'name: x\ncommand: ["python3", "a.py"\n',
            "expected ',' or ']', but got '<stream end>' (line 3, column 1)",
            id="unclosed",
        ),
    ],
)
def test_a_yaml_typo_names_the_problem_and_its_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str, says: str
) -> None:
    # A tab read only "job.yaml is neither YAML nor JSON: while scanning for the next token".
    (tmp_path / "job.yaml").write_text(content)
    assert main(["submit", "job.yaml"]) == 2
    assert one_line(capsys) == f"gangway: job.yaml is neither YAML nor JSON: {says}\n"
