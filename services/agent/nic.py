"""The node's network links, read from the kernel for a real host's heartbeats (NIC speed is
one of the signals health drains a node for).

InfiniBand and RoCE ports (`/sys/class/infiniband/<device>/ports/<n>/`: `state` and `rate`,
e.g. `400 Gb/sec (4X NDR)`) are the fabric where a host has any; otherwise its physical
Ethernet interfaces (`/sys/class/net/<name>/` with a `device`, `operstate` and `speed` in Mb/s).
Each link is measured against its own rate when first seen up, so a 1 GbE management port beside
a 400 Gb/s fabric is not "slow", a port never seen up (an unused socket) is not "down", and a
fabric link that fell to 200 Gb/s, or went down, is. A heartbeat carries the link that fell
furthest: its rate now and its rate when first seen. A rate the kernel does not know (a virtual
NIC answers -1) counts as nothing; a host with no known rate reports none. A link already slow
when the agent starts is taken at that rate (not seen as degraded until the agent restarts
after it is mended).
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass, field
from pathlib import Path

_IB_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*Gb/sec")


def ib_rate_gbps(text: str) -> float | None:
    """`400 Gb/sec (4X NDR)` → 400.0; None for text that names no rate."""
    match = _IB_RATE.match(text)
    return float(match.group(1)) if match else None


def _read(path: Path) -> str | None:
    with contextlib.suppress(OSError):
        return path.read_text().strip()
    return None


def link_rates(sys_root: Path = Path("/sys")) -> dict[str, float]:
    """Each fabric link's rate in Gb/s (0 when down), by name (`mlx5_0/1`, `eth0`)."""
    rates: dict[str, float] = {}
    for port in sorted((sys_root / "class" / "infiniband").glob("*/ports/*")):
        state = _read(port / "state") or ""
        rate = ib_rate_gbps(_read(port / "rate") or "")
        if rate is not None:
            rates[f"{port.parent.parent.name}/{port.name}"] = rate if "ACTIVE" in state else 0.0
    if rates:
        return rates
    net = sys_root / "class" / "net"
    for interface in sorted(net.iterdir()) if net.is_dir() else []:
        if not (interface / "device").exists():
            continue  # lo, bridges, veths, tunnels: no fabric
        if _read(interface / "operstate") == "down":
            rates[interface.name] = 0.0
            continue
        speed = _read(interface / "speed")
        # isascii: isdigit() alone admits digits int() refuses ('²').
        if speed is not None and speed.isascii() and speed.isdigit() and int(speed) > 0:
            rates[interface.name] = int(speed) / 1000
    return rates


@dataclass(slots=True)
class FabricLinks:
    """What a real host's heartbeat says of its links: (rate now, rate when first seen) in Gb/s
    of the link that fell furthest below its first rate."""

    sys_root: Path = Path("/sys")
    # Each link's rate when first seen up.
    nominal: dict[str, float] = field(default_factory=dict)

    def read(self) -> tuple[float | None, float | None]:
        rates = link_rates(self.sys_root)
        for name, rate in rates.items():
            if rate > 0:
                self.nominal.setdefault(name, rate)
        known = [(rates.get(name, 0.0), first) for name, first in self.nominal.items()]
        if not known:
            return None, None
        # Ties (every link at its rate): the fastest, the one a reader expects to see.
        return min(known, key=lambda link: (link[0] / link[1], -link[1]))
