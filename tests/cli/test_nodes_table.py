"""`gangway nodes` says which nodes' GPUs NVLink does not join: tensor-parallel gangs never go
there, and an operator asking why a tp job waits beside free GPUs must see it."""

from __future__ import annotations

import argparse
from typing import Any, get_args

import pytest

from gangway.commands import nodes
from services.api.projections.nodes import NodeState


def a_node(node_id: str, nvlink: bool | None) -> dict[str, Any]:
    node: dict[str, Any] = {
        "id": node_id,
        "rack": "r0",
        "block": "b0",
        "gpu_type": "H100",
        "state": "ready",
        "gpus": 8,
        "allocated_gpus": 0,
        "free_gpus": 8,
        "jobs": [],
        "reason": None,
    }
    if nvlink is not None:
        node["nvlink"] = nvlink
    return node


class FakeClient:
    def __init__(self, items: list[dict[str, Any]]) -> None:
        self.items = items

    def __enter__(self) -> FakeClient:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def nodes(self) -> dict[str, Any]:
        return {"items": self.items}


def test_the_table_marks_the_nodes_whose_gpus_talk_over_pcie(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # An API older than the field says nothing: such a node is taken as an NVLink domain.
    items = [a_node("joined", True), a_node("box", False), a_node("older", None)]
    monkeypatch.setattr(nodes, "client", lambda: FakeClient(items))

    assert nodes.run(argparse.Namespace(state=None, gpus=False)) == 0

    rows = {
        cells[0]: cells
        for line in capsys.readouterr().out.splitlines()
        if (cells := [cell.strip() for cell in line.strip("│ ").split("│")])[0]
        in ("joined", "box", "older")
    }
    assert rows["box"][3] == "H100 (PCIe)"
    assert rows["joined"][3] == "H100"
    assert rows["older"][3] == "H100"


def test_a_mistyped_state_is_refused_naming_the_states(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # `gangway nodes --state drainig` printed an empty table, as if no node were draining.
    parser = argparse.ArgumentParser(prog="gangway nodes")
    nodes.add_arguments(parser)
    with pytest.raises(SystemExit):
        parser.parse_args(["--state", "drainig"])
    err = capsys.readouterr().err
    assert "invalid choice: 'drainig'" in err
    assert "'ready', 'degraded', 'draining', 'drained', 'lost'" in err
    assert parser.parse_args(["--state", "lost"]).state == "lost"


def test_the_state_choices_are_the_apis_node_states() -> None:
    assert get_args(NodeState) == nodes.NODE_STATES
