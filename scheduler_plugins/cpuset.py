"""Linux CPU list strings (``"0-3,8,10-11"``), as cpuset.cpus and Koordinator's resource-status
annotation write them."""

from __future__ import annotations

from collections.abc import Iterable


def parse_cpuset(text: str) -> frozenset[int]:
    """The CPUs of a Linux CPU list. Raises ``ValueError`` on anything else."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        if sep:
            first, last = int(lo), int(hi)
            if last < first or first < 0:
                raise ValueError(f"bad CPU range {part!r}")
            cpus.update(range(first, last + 1))
        else:
            cpu = int(lo)
            if cpu < 0:
                raise ValueError(f"bad CPU {part!r}")
            cpus.add(cpu)
    return frozenset(cpus)


def format_cpuset(cpus: Iterable[int]) -> str:
    """The canonical Linux CPU list of ``cpus`` (sorted, ranges collapsed)."""
    ordered = sorted(set(cpus))
    parts: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts)
