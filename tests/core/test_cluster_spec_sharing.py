"""Cluster YAML node groups declare CPUs, memory, the GPU model and its MIG mode (DESIGN §8)."""

from __future__ import annotations

import pytest

from core.topology import ClusterSpecError, parse_cluster_spec

SPEC = """
groups:
  - {count: 2, gpus: 8, gpu_type: H100, cpus: 96, memory_mb: 1048576, mig: dynamic,
     reconfigure_s: 30}
  - {count: 1, gpus: 4, gpu_type: A100, gpu_model: A100-40GB,
     mig: [3g.20gb, 2g.10gb, 1g.5gb, 1g.5gb]}
  - {count: 1, gpus: 8, gpu_type: H100}
"""


def test_node_groups_declare_cpus_memory_gpu_model_and_mig() -> None:
    dynamic, _, fixed, plain = parse_cluster_spec(SPEC)
    assert (dynamic.cpus, dynamic.memory_mb, dynamic.gpu_model) == (96, 1_048_576, "H100-80GB")
    assert (dynamic.mig, dynamic.reconfigure_s) == ("dynamic", 30.0)
    assert dynamic.gpu_type == "H100"
    assert (fixed.gpu_model, fixed.mig) == ("A100-40GB", "fixed")
    assert fixed.mig_profiles == ["3g.20gb", "2g.10gb", "1g.5gb", "1g.5gb"]
    assert fixed.gpus[0].memory_mb == 40_960
    assert (plain.mig, plain.reconfigure_s, plain.cpus, plain.memory_mb) == (
        "none",
        60.0,
        None,
        None,
    )


@pytest.mark.parametrize(
    ("group", "message"),
    [
        ("{count: 1, gpu_type: H100, mig: [4g.40gb, 4g.40gb]}", "do not fit together"),
        ("{count: 1, gpu_type: H100, mig: [1g.5gb]}", "has no MIG profile 1g.5gb"),
        ("{count: 1, gpu_type: L40S, mig: dynamic}", "MIG profile table"),
        ("{count: 1, gpu_type: H100, mig: sometimes}", "none, dynamic or a list"),
        ("{count: 1, gpu_type: H100, cpus: 0}", "cpus must be at least 1"),
        ("{count: 1, gpu_type: H100, reconfigure_s: -1}", "reconfigure_s"),
    ],
)
def test_a_group_the_hardware_cannot_be_is_refused(group: str, message: str) -> None:
    with pytest.raises(ClusterSpecError, match=message):
        parse_cluster_spec(f"groups:\n  - {group}\n")
