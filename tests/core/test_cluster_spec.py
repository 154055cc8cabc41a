"""Cluster specs: the NODESxGPUS[:RACK_SIZE[:RACKS_PER_BLOCK]] shorthand and YAML node groups."""

from __future__ import annotations

import pytest

from core import ClusterSpecError, parse_cluster_spec


def test_the_shorthand_numbers_nodes_racks_and_blocks() -> None:
    nodes = parse_cluster_spec("16x8:4:2")

    assert len(nodes) == 16
    assert [n.node_id for n in nodes[:2]] == ["n0000", "n0001"]
    assert {n.rack for n in nodes} == {"r000", "r001", "r002", "r003"}
    assert {n.block for n in nodes} == {"b00", "b01"}
    assert nodes[4].rack == "r001" and nodes[8].block == "b01"
    assert all(len(n.gpus) == 8 and n.discovered_by == "spec" for n in nodes)


def test_the_shorthand_defaults_to_racks_of_16_in_blocks_of_8() -> None:
    nodes = parse_cluster_spec("176x8")

    assert len({n.rack for n in nodes}) == 11
    assert {n.block for n in nodes} == {"b00", "b01"}
    assert {n.gpu_type for n in nodes} == {"H100"}


def test_node_ids_widen_for_large_clusters() -> None:
    nodes = parse_cluster_spec("12500x8:16:8")

    assert nodes[-1].node_id == "n12499"
    assert len({n.node_id for n in nodes}) == 12500


def test_yaml_groups_give_types_labels_and_explicit_racks() -> None:
    text = """
rack_size: 2
groups:
  - count: 3
    gpus: 8
    gpu_type: A100
    labels: {zone: east}
  - count: 2
    gpus: 4
    rack: special
    block: bx
"""
    nodes = parse_cluster_spec(text)

    assert [n.gpu_type for n in nodes] == ["A100"] * 3 + ["H100"] * 2
    assert [n.rack for n in nodes] == ["r000", "r000", "r001", "special", "special"]
    assert nodes[0].labels == {"zone": "east"}
    assert nodes[4].block == "bx" and len(nodes[4].gpus) == 4


@pytest.mark.parametrize(
    "text",
    [
        "",
        "0x8",
        "4x0",
        "4x8:0",
        "abc: [",
        "- count: -1",
        "- {count: 1, gpus: many}",
        "- {count: 1, colour: red}",
        "- {count: 1, nvlink: maybe}",
        "- {count: 1, nvlink: 0}",
        "just words",
        "4x8:2:1:9",
    ],
)
def test_bad_specs_raise_a_one_line_cluster_spec_error(text: str) -> None:
    with pytest.raises(ClusterSpecError) as caught:
        parse_cluster_spec(text)

    assert "\n" not in str(caught.value)
