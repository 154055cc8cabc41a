"""MIG profile tables and geometries: the H100 table is what NVML read from a real H100 80GB,
and a geometry is valid exactly when its instances sit at legal slots without overlapping,
within each profile's count and the GPU's 7 compute slices."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from core.mig import (
    H100_80GB,
    MIG_MODELS,
    MigInstance,
    MigModel,
    addable_starts,
    all_valid_geometries,
    geometry_problems,
    geometry_with,
    mig_model,
    pack,
    valid_geometry,
)

HARDWARE = Path(__file__).parents[1] / "fixtures" / "hardware" / "h100-80gb-hbm3.nvml.json"


def g(*instances: tuple[str, int]) -> tuple[MigInstance, ...]:
    return tuple(MigInstance(start, profile) for profile, start in instances)


def test_the_h100_table_is_what_nvml_reported_on_a_real_h100() -> None:
    nvml = json.loads(HARDWARE.read_text())
    read = {
        row["name"].removeprefix("MIG "): (
            row["id"],
            row["slice_count"],
            row["instance_count"],
            row["memory_mb"],
            tuple((p["start"], p["size"]) for p in row["placements"]),
        )
        for row in nvml["profiles"]
    }
    ours = {
        name: (p.profile_id, p.compute_slices, p.instance_count, p.memory_mb, p.placements)
        for name, p in H100_80GB.profiles.items()
    }
    assert ours == read
    assert H100_80GB.memory_mb == nvml["memory_mb"]


def test_the_issue_s_h100_placements() -> None:
    starts = {name: H100_80GB.profiles[name].starts for name in H100_80GB.profiles}
    assert starts["1g.10gb"] == (0, 1, 2, 3, 4, 5, 6)
    assert starts["2g.20gb"] == (0, 2, 4)
    assert starts["3g.40gb"] == (0, 4)
    assert starts["4g.40gb"] == (0,)
    assert starts["7g.80gb"] == (0,)
    assert starts["1g.20gb"] == (0, 2, 4, 6)


@pytest.mark.parametrize(
    "geometry",
    [
        g(*(("1g.10gb", s) for s in range(7))),
        g(("4g.40gb", 0), ("3g.40gb", 4)),
        g(("3g.40gb", 0), ("3g.40gb", 4)),
        g(("2g.20gb", 0), ("2g.20gb", 2), ("3g.40gb", 4)),
        g(("7g.80gb", 0)),
        g(("1g.20gb", 0), ("1g.20gb", 2), ("1g.20gb", 4), ("1g.20gb", 6)),
        g(("3g.40gb", 0), ("1g.10gb", 4), ("1g.10gb", 5), ("1g.20gb", 6)),
    ],
)
def test_valid_h100_geometries(geometry: tuple[MigInstance, ...]) -> None:
    assert geometry_problems(H100_80GB, geometry) == []


@pytest.mark.parametrize(
    ("geometry", "problem"),
    [
        (g(("2g.20gb", 1)), "cannot start at slot 1"),
        (g(("3g.40gb", 0), ("2g.20gb", 2)), "overlaps"),
        (g(("4g.40gb", 0), ("4g.40gb", 0)), "overlaps"),
        (g(("1g.10gb+me", 0), ("1g.10gb+me", 1)), "at most 1 per GPU"),
        (g(("7g.80gb", 0), ("1g.10gb", 3)), "overlaps"),
        (g(("1g.5gb", 0)), "no profile 1g.5gb"),
        # Four 1g.20gb fill the 8 memory slices; a 1g.10gb has no room left.
        (g(*(("1g.20gb", s) for s in (0, 2, 4)), ("1g.10gb", 6), ("1g.10gb", 7)), "slot 7"),
    ],
)
def test_invalid_h100_geometries(geometry: tuple[MigInstance, ...], problem: str) -> None:
    problems = geometry_problems(H100_80GB, geometry)
    assert any(problem in p for p in problems), problems


def _oracle(model: MigModel, geometry: tuple[MigInstance, ...]) -> bool:
    """The rules written out again, slot by slot, to judge the tables' own checker."""
    used: list[int] = []
    compute = 0
    for instance in geometry:
        profile = model.profiles.get(instance.profile)
        if profile is None or instance.start not in profile.starts:
            return False
        size = dict(profile.placements)[instance.start]
        used.extend(range(instance.start, instance.start + size))
        compute += profile.compute_slices
    counts = [i.profile for i in geometry]
    within_counts = all(counts.count(n) <= model.profiles[n].instance_count for n in counts)
    return (
        len(used) == len(set(used)) and max(used, default=0) < 8 and compute <= 7 and within_counts
    )


@pytest.mark.parametrize("model", list(MIG_MODELS.values()), ids=lambda m: m.name)
def test_every_enumerated_geometry_is_valid_and_the_full_ones_are_reached(model: MigModel) -> None:
    geometries = all_valid_geometries(model)
    assert all(_oracle(model, geometry) for geometry in geometries)
    assert len(set(geometries)) == len(geometries)
    # Seven of the profile that fits seven times, and the one whole-GPU instance, are reachable.
    (seventh,) = [n for n, p in model.profiles.items() if p.instance_count == 7]
    assert pack(model, [seventh] * 7) is not None
    assert any(
        len(geometry) == 1 and model.profiles[geometry[0].profile].compute_slices == 7
        for geometry in geometries
    )


@pytest.mark.parametrize("model", list(MIG_MODELS.values()), ids=lambda m: m.name)
def test_pack_finds_a_geometry_exactly_when_one_exists(model: MigModel) -> None:
    # Every multiset of profiles that some valid geometry holds is packed; others are not.
    holdable = {
        tuple(sorted(i.profile for i in geometry)) for geometry in all_valid_geometries(model)
    }
    for profiles in holdable:
        packed = pack(model, list(profiles))
        assert packed is not None and valid_geometry(model, packed)
        assert sorted(i.profile for i in packed) == list(profiles)
    names = sorted(model.profiles)
    for a in names:
        for b in names:
            if tuple(sorted((a, b, b))) not in holdable:
                assert pack(model, [a, b, b]) is None


def test_a_repartition_keeps_instances_in_use_where_they_are() -> None:
    kept = g(("3g.40gb", 4))
    grown = geometry_with(H100_80GB, kept, ["2g.20gb", "1g.10gb", "1g.10gb"])
    assert grown is not None and set(kept) <= set(grown)
    assert geometry_with(H100_80GB, kept, ["4g.40gb", "1g.10gb"]) is None
    assert addable_starts(H100_80GB, kept, "2g.20gb") == [0, 2]


@pytest.mark.parametrize(
    ("name", "model"),
    [
        ("H100", "H100-80GB"),
        ("NVIDIA H100 80GB HBM3", "H100-80GB"),
        ("A100-40GB", "A100-40GB"),
        ("a100", "A100-80GB"),
        ("H200", "H200-141GB"),
    ],
)
def test_a_gpu_model_goes_by_several_names(name: str, model: str) -> None:
    found = mig_model(name)
    assert found is not None and found.name == model
    assert mig_model("L40S") is None and mig_model(None) is None
