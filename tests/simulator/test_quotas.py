"""Quota files: tenant,guaranteed_gpus[,max_gpus], and quotas derived from node counts."""

from __future__ import annotations

from pathlib import Path

import pytest

from gangway.simulator.quotas import Quota, QuotaError, quotas_from_node_counts, read_quotas


def test_header_is_optional_and_an_empty_max_means_no_ceiling(tmp_path: Path) -> None:
    path = tmp_path / "q.csv"
    path.write_text("tenant,guaranteed_gpus,max_gpus\na,8,16\nb,4,\nc,2\n")
    assert read_quotas(path) == {
        "a": Quota("a", 8, 16),
        "b": Quota("b", 4, None),
        "c": Quota("c", 2, None),
    }
    path.write_text("a,8,8\n")
    assert read_quotas(path) == {"a": Quota("a", 8, 8)}


def test_a_ceiling_below_the_guarantee_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "q.csv"
    path.write_text("a,8,4\n")
    with pytest.raises(QuotaError, match="line 1: max_gpus 4 is below guaranteed_gpus 8"):
        read_quotas(path)


def test_node_counts_become_scaled_guarantees(tmp_path: Path) -> None:
    path = tmp_path / "vc.csv"
    path.write_text("vc,node num\nx,16\ny,3\n")
    assert quotas_from_node_counts(path, scale=0.5) == {
        "x": Quota("x", 64, None),
        "y": Quota("y", 12, None),
    }
    assert quotas_from_node_counts(path, borrowing=False)["y"] == Quota("y", 24, 24)
