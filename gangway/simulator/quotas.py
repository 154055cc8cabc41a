"""Tenant quotas for a simulation: `tenant,guaranteed_gpus[,max_gpus]` CSV files.

A header row `tenant,guaranteed_gpus,max_gpus` is optional. An empty or absent max means no
ceiling (the tenant may borrow any idle GPU); max = guaranteed means no borrowing.

Run as a module, it derives a quota file from a per-tenant node count such as
`philly_vc_nodes_helios.csv` (`vc,node num`): guaranteed = nodes x GPUs per node x scale.

    python -m gangway.simulator.quotas philly_vc_nodes_helios.csv --scale 0.5 > quotas.csv
    python -m gangway.simulator.quotas philly_vc_nodes_helios.csv --no-borrowing > strict.csv
"""

from __future__ import annotations

import argparse
import csv
import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from schemas.jobs import NAME_PATTERN

_NAME = re.compile(NAME_PATTERN)


class QuotaError(ValueError):
    """The quota file cannot be read; the message is one line for the user."""


@dataclass(frozen=True, slots=True)
class Quota:
    tenant: str
    guaranteed_gpus: int
    max_gpus: int | None


def read_quotas(path: str | Path) -> dict[str, Quota]:
    """The quotas of a `tenant,guaranteed_gpus[,max_gpus]` file, by tenant."""
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise QuotaError(f"cannot read quotas {file}: {error}") from None
    quotas: dict[str, Quota] = {}
    rows = csv.reader(text.splitlines())
    for number, row in enumerate(rows, start=1):
        cells = [cell.strip() for cell in row]
        if not cells or not any(cells) or cells[0].startswith("#"):
            continue
        where = f"{file} line {number}"
        if number == 1 and cells[0].lower() in ("tenant", "vc", "team"):
            continue  # the optional header row
        if len(cells) < 2:
            raise QuotaError(f"{where}: expected tenant,guaranteed_gpus[,max_gpus]")
        tenant = cells[0]
        if not _NAME.match(tenant):
            raise QuotaError(f"{where}: tenant {tenant!r} is not a valid name")
        guaranteed = _gpus(where, "guaranteed_gpus", cells[1])
        ceiling = _gpus(where, "max_gpus", cells[2]) if len(cells) > 2 and cells[2] else None
        if ceiling is not None and ceiling < guaranteed:
            raise QuotaError(f"{where}: max_gpus {ceiling} is below guaranteed_gpus {guaranteed}")
        if tenant in quotas:
            raise QuotaError(f"{where}: tenant {tenant!r} appears twice")
        quotas[tenant] = Quota(tenant, guaranteed, ceiling)
    if not quotas:
        raise QuotaError(f"{file}: no quotas in the file")
    return quotas


def quotas_from_node_counts(
    path: str | Path, *, gpus_per_node: int = 8, scale: float = 1.0, borrowing: bool = True
) -> dict[str, Quota]:
    """Quotas from a `tenant,nodes` file (e.g. the Helios `vc,node num` file).

    Guarantees are rounded down so that scaled guarantees never sum to more than scaled nodes.
    """
    file = Path(path)
    try:
        rows = list(csv.reader(file.read_text(encoding="utf-8").splitlines()))
    except (OSError, UnicodeDecodeError) as error:
        raise QuotaError(f"cannot read {file}: {error}") from None
    quotas: dict[str, Quota] = {}
    for number, row in enumerate(rows, start=1):
        cells = [cell.strip() for cell in row]
        if len(cells) < 2 or (number == 1 and not cells[1].isdigit()):
            continue
        nodes = _gpus(f"{file} line {number}", "nodes", cells[1])
        guaranteed = math.floor(nodes * gpus_per_node * scale)
        quotas[cells[0]] = Quota(cells[0], guaranteed, guaranteed if not borrowing else None)
    return quotas


def _gpus(where: str, name: str, text: str) -> int:
    try:
        value = float(text)
    except ValueError:
        raise QuotaError(f"{where}: {name} {text!r} is not a whole number") from None
    if not value.is_integer() or value < 0:
        raise QuotaError(f"{where}: {name} {text!r} must be a whole number >= 0")
    return int(value)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m gangway.simulator.quotas",
        description="Write a tenant,guaranteed_gpus,max_gpus file from a tenant,nodes file.",
    )
    parser.add_argument("nodes_csv", help="tenant,nodes CSV (e.g. philly_vc_nodes_helios.csv)")
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--scale", type=float, default=1.0, help="multiply every guarantee")
    parser.add_argument(
        "--no-borrowing", action="store_true", help="max_gpus = guaranteed_gpus (no borrowing)"
    )
    args = parser.parse_args(argv)
    try:
        quotas = quotas_from_node_counts(
            args.nodes_csv,
            gpus_per_node=args.gpus_per_node,
            scale=args.scale,
            borrowing=not args.no_borrowing,
        )
    except QuotaError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    out = csv.writer(sys.stdout, lineterminator="\n")
    out.writerow(["tenant", "guaranteed_gpus", "max_gpus"])
    for quota in quotas.values():
        out.writerow(
            [quota.tenant, quota.guaranteed_gpus, "" if quota.max_gpus is None else quota.max_gpus]
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
