"""gangway submit / jobs / job / why / cancel / events / nodes / queues, end to end."""

from __future__ import annotations

import asyncio
import json
import os
import re
import threading
import time
from pathlib import Path

import httpx
import pytest

from gangway.cli import main
from schemas.checkpoints import CheckpointCommitted, CheckpointFailed, CheckpointShard
from services.runtime import EventStore, Settings
from tests.api.builders import node

pytestmark = pytest.mark.integration

SPEC_YAML = """\
name: llama-ft
team: nlp
priority: production
tasks: 2
gpus_per_task: 4
command: [torchrun, train.py]
"""


def ensure_team(name: str = "nlp") -> None:
    """The API refuses a job of a team it does not know: create it (once) as the admin."""
    response = httpx.post(
        f"{os.environ['GANGWAY_API_URL']}/v1/teams",
        json={"name": name},
        headers={"Authorization": f"Bearer {os.environ['GANGWAY_TOKEN']}"},
    )
    assert response.status_code in (201, 409), response.text


def submit(tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str = SPEC_YAML) -> str:
    ensure_team()
    spec = tmp_path / "job.yaml"
    spec.write_text(text)
    assert main(["submit", str(spec)]) == 0
    match = re.search(r"submitted job (\S+) \(pending\)", capsys.readouterr().out)
    assert match
    return match.group(1)


def test_submit_reads_a_yaml_spec_and_prints_the_job_id(
    api_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job_id = submit(tmp_path, capsys)
    assert main(["job", job_id]) == 0
    out = capsys.readouterr().out
    assert "llama-ft" in out and "production" in out and "pending" in out


def test_submit_reads_a_json_spec(
    api_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job_id = submit(tmp_path, capsys, json.dumps({"name": "j", "team": "nlp"}))
    assert job_id


def test_an_invalid_spec_is_one_line_naming_the_field(
    api_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = tmp_path / "bad.yaml"
    spec.write_text("name: x\nteam: nlp\ntasks: 2\nmin_tasks: 3\n")
    assert main(["submit", str(spec)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gangway: invalid job spec:") and "min_tasks" in err
    assert err.count("\n") == 1


def test_jobs_lists_the_submitted_jobs(
    api_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first = submit(tmp_path, capsys)
    second = submit(tmp_path, capsys)
    assert main(["jobs"]) == 0
    out = capsys.readouterr().out
    assert first in out and second in out


def test_why_gives_the_reason(
    api_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job_id = submit(tmp_path, capsys)
    assert main(["why", job_id]) == 0
    out = capsys.readouterr().out
    assert f"job {job_id} is pending" in out and "reason: awaiting admission" in out


def test_cancel_records_the_request(
    api_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job_id = submit(tmp_path, capsys)
    assert main(["cancel", job_id]) == 0
    assert f"cancel requested for job {job_id}" in capsys.readouterr().out


def test_an_unknown_job_is_a_one_line_error(
    api_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["job", "123"]) == 1
    assert capsys.readouterr().err == "gangway: job 123 not found\n"


def test_a_bad_token_is_a_one_line_error(
    api_url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GANGWAY_TOKEN", "wrong")
    assert main(["jobs"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("gangway: unknown token") and err.count("\n") == 1


def test_events_prints_the_log_in_order(
    api_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job_id = submit(tmp_path, capsys)
    assert main(["events", "--json"]) == 0
    events = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(e["type"], e["stream"]) for e in events] == [
        ("TeamCreated", "team-nlp"),
        ("QueueConfigured", "queue-nlp"),
        ("JobSubmitted", f"job-{job_id}"),
    ]


def test_nodes_and_queues_print_tables(api_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["nodes"]) == 0
    assert "NODE" in capsys.readouterr().out
    assert main(["queues"]) == 0
    assert "QUEUE" in capsys.readouterr().out


def test_queues_show_the_cpu_and_memory_ceilings(
    api_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    admin = {"Authorization": f"Bearer {os.environ['GANGWAY_TOKEN']}"}
    body = {"name": "prep", "guaranteed_gpus": 0, "max_gpus": 8}
    assert httpx.post(f"{api_url}/v1/teams", json=body, headers=admin).status_code == 201
    ceilings = {"max_cpus": 64, "max_memory_mb": 262144}
    patched = httpx.patch(f"{api_url}/v1/queues/prep", json=ceilings, headers=admin)
    assert patched.status_code == 200, patched.text
    assert main(["queues"]) == 0
    out = capsys.readouterr().out
    assert "CPUS" in out and "MEMORY" in out
    [row] = [line for line in out.splitlines() if "prep" in line]
    cells = [cell.strip() for cell in row.strip("│ ").split("│")]
    assert cells[-2:] == ["0/64", "0/262144 MB"]


def test_teams_prints_each_visible_team_with_its_quota(
    api_url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    admin = {"Authorization": f"Bearer {os.environ['GANGWAY_TOKEN']}"}
    tokens = {}
    for name, guaranteed in (("nlp", 16), ("vision", 8)):
        body = {"name": name, "guaranteed_gpus": guaranteed, "max_gpus": 32}
        response = httpx.post(f"{api_url}/v1/teams", json=body, headers=admin)
        tokens[name] = response.json()["token"]
    assert main(["teams"]) == 0
    out = capsys.readouterr().out
    assert "TEAM" in out and "GUARANTEED" in out
    rows = [
        [cell.strip() for cell in line.strip("│ ").split("│")]
        for line in out.splitlines()
        if "nlp" in line or "vision" in line
    ]
    assert [row[:4] for row in rows] == [["nlp", "-", "16", "32"], ["vision", "-", "8", "32"]]
    assert main(["teams", "-o", "json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [(t["name"], t["guaranteed_gpus"]) for t in listed] == [("nlp", 16), ("vision", 8)]
    # A team's token sees its own team only.
    monkeypatch.setenv("GANGWAY_TOKEN", tokens["vision"])
    assert main(["teams", "-o", "json"]) == 0
    assert [t["name"] for t in json.loads(capsys.readouterr().out)] == ["vision"]


def test_events_follow_prints_events_recorded_after_it_started(
    api_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first = submit(tmp_path, capsys)
    status: list[int] = []
    follower = threading.Thread(
        target=lambda: status.append(
            # The team's two events, then the two jobs'.
            main(["events", "--follow", "--limit", "4", "--interval", "0.05"])
        )
    )
    follower.start()
    time.sleep(0.3)
    # Submitted without submit()'s own read of the output: the follower may print the second
    # job's events before that read (it did under load), and they would be lost to the test.
    assert main(["submit", str(tmp_path / "job.yaml")]) == 0
    follower.join(30)
    assert status == [0]
    out = capsys.readouterr().out
    second = re.search(r"submitted job (\S+) \(pending\)", out)
    assert first and second
    assert f"job-{second.group(1)}" in out


def test_drain_and_undrain_a_node(
    api_url: str, settings: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    async def register() -> None:
        store = await EventStore.connect(settings)
        try:
            await store.append("node-n1", 0, [node("n1")])
        finally:
            await store.close()

    asyncio.run(register())
    assert main(["drain", "n1", "--reason", "new cable"]) == 0
    assert capsys.readouterr().out == "node n1 is draining: new cable\n"
    assert main(["undrain", "n1"]) == 0
    assert capsys.readouterr().out == "node n1 is ready\n"
    assert main(["undrain", "n1"]) == 1
    assert "not drained" in capsys.readouterr().err


def test_submit_of_a_gang_the_cluster_could_never_hold_says_so_and_fails(
    api_url: str, settings: Settings, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    async def register() -> None:
        store = await EventStore.connect(settings)
        try:
            await store.append("node-n1", 0, [node("n1")])
        finally:
            await store.close()

    asyncio.run(register())
    admin = {"Authorization": f"Bearer {os.environ['GANGWAY_TOKEN']}"}
    deadline = time.monotonic() + 30
    while not httpx.get(f"{api_url}/v1/nodes", headers=admin).json()["items"]:
        assert time.monotonic() < deadline, "the API never saw the node"
        time.sleep(0.05)
    ensure_team()
    spec = tmp_path / "wide.yaml"
    spec.write_text("name: wide\nteam: nlp\ntasks: 2\ngpus_per_task: 8\ncommand: [x]\n")
    assert main(["submit", str(spec)]) == 2  # the spec's fault, as for any invalid spec
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        "gangway: invalid job spec: needs 2 tasks of 8 GPUs but the cluster can hold at most 1\n"
    )
    assert main(["jobs", "--all", "-o", "json"]) == 0
    assert json.loads(capsys.readouterr().out) == []


def test_why_shows_a_failed_checkpoint_and_what_the_job_resumes_from(
    api_url: str, settings: Settings, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job_id = submit(tmp_path, capsys)

    async def checkpoints() -> None:
        store = await EventStore.connect(settings)
        try:
            shard = CheckpointShard(rank=0, uri="file:///c/0", bytes=1, sha256="0" * 64)
            await store.append(
                f"checkpoint-{job_id}",
                None,
                [
                    CheckpointCommitted(
                        job_id=job_id, attempt=1, checkpoint_id="a1-one", step=7, shards=[shard]
                    ),
                    CheckpointFailed(
                        job_id=job_id,
                        attempt=1,
                        checkpoint_id="a1-two",
                        reason="rank 0: FileNotFoundError: rank-0.bin.tmp",
                    ),
                ],
            )
        finally:
            await store.close()

    asyncio.run(checkpoints())
    assert main(["why", job_id]) == 0
    out = capsys.readouterr().out
    assert "last checkpoint: a1-two failed at" in out
    assert "rank 0: FileNotFoundError: rank-0.bin.tmp; resumes from a1-one" in out


PIPELINE_YAML = """\
name: preprocess
team: nlp
tasks: 1
gpus_per_task: 1
---
name: train
team: nlp
tasks: 2
gpus_per_task: 4
depends_on: [{job: preprocess}]
---
name: eval
team: nlp
depends_on: [{job: train, condition: finished}]
"""


def test_a_multi_document_file_submits_a_pipeline_whose_stages_name_each_other(
    api_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ensure_team()
    pipeline = tmp_path / "pipeline.yaml"
    pipeline.write_text(PIPELINE_YAML)
    assert main(["submit", str(pipeline)]) == 0
    found = re.findall(r"submitted job (\S+) (\S+) \(pending\)", capsys.readouterr().out)
    assert [name for _, name in found] == ["preprocess", "train", "eval"]
    ids = {name: job_id for job_id, name in found}
    assert main(["job", ids["train"]]) == 0
    capsys.readouterr()
    job = httpx.get(
        f"{api_url}/v1/jobs/{ids['eval']}",
        headers={"Authorization": f"Bearer {os.environ['GANGWAY_TOKEN']}"},
    ).json()
    assert job["spec"]["depends_on"] == [{"job": ids["train"], "condition": "finished"}]


def test_a_pipeline_with_one_bad_document_submits_nothing(
    api_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ensure_team()
    pipeline = tmp_path / "pipeline.yaml"
    pipeline.write_text(PIPELINE_YAML.replace("tasks: 2", "tasks: 0"))
    assert main(["submit", str(pipeline)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gangway: invalid job spec: document 2") and "tasks" in err
    assert main(["jobs"]) == 0
    assert "preprocess" not in capsys.readouterr().out


def test_hold_release_and_why_on_an_array_and_one_element(
    api_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ensure_team()
    spec = tmp_path / "sweep.yaml"
    spec.write_text("name: sweep\nteam: nlp\narray: {count: 3, max_parallel: 2}\n")
    assert main(["submit", str(spec)]) == 0
    out = capsys.readouterr().out
    array_id = re.search(r"submitted job (\S+) \(pending\)", out)
    assert array_id and f"array of 3: {array_id.group(1)}_0" in out
    ident = array_id.group(1)
    assert main(["hold", ident]) == 0
    assert f"held job {ident}" in capsys.readouterr().out
    assert main(["why", ident]) == 0
    out = capsys.readouterr().out
    assert f"array {ident} is pending: 3 jobs, at most 2 at once (3 pending)" in out
    assert f"{ident}_2 pending: held by request" in out
    assert main(["release", f"{ident}_1"]) == 0
    capsys.readouterr()
    assert main(["why", f"{ident}_1"]) == 0
    assert "held" not in capsys.readouterr().out
    assert main(["cancel", ident]) == 0
    assert f"cancel requested for job {ident}" in capsys.readouterr().out
