"""MIG profile tables per GPU model and the rules of a valid geometry. Pure data and functions.

A GPU in MIG mode holds a *geometry*: GPU instances, each of one profile at one start slot.
NVML describes a GPU as 8 memory slices and 7 compute slices; each profile has a fixed list of
placements (start, size) in memory slices. Two instances coexist only where their
[start, start + size) ranges do not overlap, each profile appears at most `instance_count`
times, and the compute slices of all instances stay within the GPU's 7.

Where the tables come from:
- H100-80GB: read from a real NVIDIA H100 80GB HBM3 through NVML (nvmlDeviceGetGpuInstance-
  ProfileInfo / ...PossiblePlacements, driver 580.159.04): tests/fixtures/hardware/, and a test
  checks this table against that file.
- A100-40GB, A100-80GB, H200-141GB: NVIDIA's MIG user guide ("Supported MIG Profiles"), same
  placements as the H100 (the guide's diagrams); memory is the guide's GB figure x 1024 MB, a
  little above what NVML reports on real parts (the H100's 1g.10gb is 9,984 MB, not 10,240).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

MEMORY_SLICES = 8
COMPUTE_SLICES = 7


@dataclass(frozen=True, slots=True)
class MigProfile:
    name: str  # "1g.10gb": NVIDIA's name without the "MIG " prefix
    profile_id: int  # NVML's GPU-instance profile id
    compute_slices: int
    memory_mb: int
    instance_count: int  # at most this many per GPU
    placements: tuple[tuple[int, int], ...]  # legal (start, size) in memory slices

    @property
    def starts(self) -> tuple[int, ...]:
        return tuple(start for start, _ in self.placements)

    def size_at(self, start: int) -> int | None:
        for placed, size in self.placements:
            if placed == start:
                return size
        return None

    @property
    def compute_share(self) -> float:
        """What one instance counts of its GPU's compute (1g of an H100: 1/7)."""
        return self.compute_slices / COMPUTE_SLICES


@dataclass(frozen=True, slots=True)
class MigModel:
    name: str  # "H100-80GB"
    memory_mb: int
    profiles: Mapping[str, MigProfile]
    source: str

    def profile(self, name: str) -> MigProfile | None:
        return self.profiles.get(name)


@dataclass(frozen=True, slots=True, order=True)
class MigInstance:
    """One GPU instance of a geometry: a profile at a start slot."""

    start: int
    profile: str


Geometry = tuple[MigInstance, ...]


def _p(
    name: str, pid: int, compute: int, memory_mb: int, count: int, starts: Sequence[int], size: int
) -> MigProfile:
    return MigProfile(name, pid, compute, memory_mb, count, tuple((s, size) for s in starts))


_SEVEN = (0, 1, 2, 3, 4, 5, 6)
_HALVES = (0, 2, 4, 6)
_THIRDS = (0, 2, 4)


def _model(name: str, memory_mb: int, source: str, rows: Iterable[MigProfile]) -> MigModel:
    return MigModel(name, memory_mb, {row.name: row for row in rows}, source)


# The NVML figures of a real H100 80GB HBM3 (tests/fixtures/hardware/h100-80gb-hbm3.nvml.json).
H100_80GB = _model(
    "H100-80GB",
    81_559,
    "NVML on an NVIDIA H100 80GB HBM3, driver 580.159.04",
    [
        _p("1g.10gb", 19, 1, 9_984, 7, _SEVEN, 1),
        _p("1g.10gb+me", 20, 1, 9_984, 1, _SEVEN, 1),
        _p("1g.20gb", 15, 1, 20_096, 4, _HALVES, 2),
        _p("2g.20gb", 14, 2, 20_096, 3, _THIRDS, 2),
        _p("3g.40gb", 9, 3, 40_448, 2, (0, 4), 4),
        _p("4g.40gb", 5, 4, 40_448, 1, (0,), 4),
        _p("7g.80gb", 0, 7, 81_152, 1, (0,), 8),
    ],
)
_GUIDE = "NVIDIA MIG user guide, Supported MIG Profiles"
A100_40GB = _model(
    "A100-40GB",
    40_960,
    _GUIDE,
    [
        _p("1g.5gb", 19, 1, 5_120, 7, _SEVEN, 1),
        _p("1g.5gb+me", 20, 1, 5_120, 1, _SEVEN, 1),
        _p("1g.10gb", 15, 1, 10_240, 4, _HALVES, 2),
        _p("2g.10gb", 14, 2, 10_240, 3, _THIRDS, 2),
        _p("3g.20gb", 9, 3, 20_480, 2, (0, 4), 4),
        _p("4g.20gb", 5, 4, 20_480, 1, (0,), 4),
        _p("7g.40gb", 0, 7, 40_960, 1, (0,), 8),
    ],
)
A100_80GB = _model(
    "A100-80GB",
    81_920,
    _GUIDE,
    [
        _p("1g.10gb", 19, 1, 10_240, 7, _SEVEN, 1),
        _p("1g.10gb+me", 20, 1, 10_240, 1, _SEVEN, 1),
        _p("1g.20gb", 15, 1, 20_480, 4, _HALVES, 2),
        _p("2g.20gb", 14, 2, 20_480, 3, _THIRDS, 2),
        _p("3g.40gb", 9, 3, 40_960, 2, (0, 4), 4),
        _p("4g.40gb", 5, 4, 40_960, 1, (0,), 4),
        _p("7g.80gb", 0, 7, 81_920, 1, (0,), 8),
    ],
)
H200_141GB = _model(
    "H200-141GB",
    144_384,
    _GUIDE,
    [
        _p("1g.18gb", 19, 1, 18_432, 7, _SEVEN, 1),
        _p("1g.18gb+me", 20, 1, 18_432, 1, _SEVEN, 1),
        _p("1g.35gb", 15, 1, 35_840, 4, _HALVES, 2),
        _p("2g.35gb", 14, 2, 35_840, 3, _THIRDS, 2),
        _p("3g.71gb", 9, 3, 72_704, 2, (0, 4), 4),
        _p("4g.71gb", 5, 4, 72_704, 1, (0,), 4),
        _p("7g.141gb", 0, 7, 144_384, 1, (0,), 8),
    ],
)

MIG_MODELS: Mapping[str, MigModel] = {
    model.name: model for model in (H100_80GB, A100_40GB, A100_80GB, H200_141GB)
}
# The names a GPU model goes by (the cluster spec's gpu_type, NVML's product name).
_ALIASES: Mapping[str, str] = {
    "h100": "H100-80GB",
    "h100-80gb": "H100-80GB",
    "h100 80gb hbm3": "H100-80GB",
    "nvidia h100 80gb hbm3": "H100-80GB",
    "h100-sxm5-80gb": "H100-80GB",
    "a100": "A100-80GB",
    "a100-80gb": "A100-80GB",
    "a100-sxm4-80gb": "A100-80GB",
    "nvidia a100-sxm4-80gb": "A100-80GB",
    "a100-40gb": "A100-40GB",
    "a100-sxm4-40gb": "A100-40GB",
    "nvidia a100-sxm4-40gb": "A100-40GB",
    "h200": "H200-141GB",
    "h200-141gb": "H200-141GB",
    "nvidia h200": "H200-141GB",
}


def mig_model(name: str | None) -> MigModel | None:
    """The profile table of a GPU model by any of its names; None for a model without MIG."""
    if not name:
        return None
    key = name.strip().lower()
    if key.startswith("nvidia ") and key not in _ALIASES:
        key = key[len("nvidia ") :]
    canonical = _ALIASES.get(key)
    return MIG_MODELS.get(canonical) if canonical is not None else None


def profile_names(models: Iterable[str | None]) -> set[str]:
    """Every profile some of these GPU models offer."""
    names: set[str] = set()
    for name in models:
        model = mig_model(name)
        if model is not None:
            names.update(model.profiles)
    return names


def geometry_problems(model: MigModel, geometry: Iterable[MigInstance]) -> list[str]:
    """Why the geometry cannot exist on a GPU of `model` (empty: it is valid)."""
    problems: list[str] = []
    used = [False] * MEMORY_SLICES
    counts: Counter[str] = Counter()
    compute = 0
    for instance in sorted(geometry):
        profile = model.profile(instance.profile)
        if profile is None:
            problems.append(f"{model.name} has no profile {instance.profile}")
            continue
        size = profile.size_at(instance.start)
        if size is None:
            problems.append(f"{instance.profile} cannot start at slot {instance.start}")
            continue
        span = range(instance.start, instance.start + size)
        if any(used[slot] for slot in span):
            problems.append(f"{instance.profile} at slot {instance.start} overlaps another")
        for slot in span:
            used[slot] = True
        counts[instance.profile] += 1
        compute += profile.compute_slices
    for name, count in sorted(counts.items()):
        limit = model.profiles[name].instance_count
        if count > limit:
            problems.append(f"{count} instances of {name}, at most {limit} per GPU")
    if compute > COMPUTE_SLICES:
        problems.append(f"{compute} compute slices, at most {COMPUTE_SLICES}")
    return problems


def valid_geometry(model: MigModel, geometry: Iterable[MigInstance]) -> bool:
    return not geometry_problems(model, geometry)


def addable_starts(model: MigModel, geometry: Geometry, profile_name: str) -> list[int]:
    """The start slots where one more instance of the profile keeps the geometry valid."""
    profile = model.profile(profile_name)
    if profile is None:
        return []
    return [
        start
        for start in profile.starts
        if valid_geometry(model, (*geometry, MigInstance(start, profile_name)))
    ]


def pack(model: MigModel, profiles: Sequence[str]) -> Geometry | None:
    """A valid geometry holding one instance of each profile named, or None if none exists."""
    return geometry_with(model, (), profiles)


def geometry_with(
    model: MigModel, keep: Iterable[MigInstance], want: Sequence[str]
) -> Geometry | None:
    """A valid geometry that keeps the instances in `keep` where they are and adds one
    instance of each profile in `want`, or None: a re-partition of a GPU's free part never
    moves an instance in use.

    Largest first, each at its lowest start that stays valid; when that greedy choice fails the
    search backtracks (at most 7 instances over 8 slots: a few hundred steps at worst)."""
    kept = tuple(sorted(keep))
    if not valid_geometry(model, kept) or any(model.profile(name) is None for name in want):
        return None
    order = sorted(want, key=lambda name: _size_key(model, name), reverse=True)

    def place(index: int, current: Geometry) -> Geometry | None:
        if index == len(order):
            return tuple(sorted(current))
        for start in addable_starts(model, current, order[index]):
            found = place(index + 1, (*current, MigInstance(start, order[index])))
            if found is not None:
                return found
        return None

    return place(0, kept)


def _size_key(model: MigModel, name: str) -> tuple[int, int]:
    profile = model.profiles[name]
    return (profile.placements[0][1], profile.compute_slices)


def all_valid_geometries(model: MigModel) -> list[Geometry]:
    """Every valid geometry of the model, the empty one included (for tests and the packer's
    look-ahead; a few hundred per model)."""
    candidates = [
        MigInstance(start, name)
        for name, profile in sorted(model.profiles.items())
        for start in profile.starts
    ]
    found: list[Geometry] = []

    def extend(first: int, current: Geometry) -> None:
        found.append(current)
        for index in range(first, len(candidates)):
            grown = tuple(sorted((*current, candidates[index])))
            if valid_geometry(model, grown):
                extend(index + 1, grown)

    extend(0, ())
    return found


def compute_thousandths(model: MigModel, profile_name: str) -> int:
    """What one instance counts of its GPU's compute, in exact thousandths rounded down."""
    profile = model.profiles[profile_name]
    return profile.compute_slices * 1000 // COMPUTE_SLICES
