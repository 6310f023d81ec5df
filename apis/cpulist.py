"""CPU lists (``"0-3,8-11"``): the kernel's cpulist format, which Kubernetes' ``cpuset`` and
Koordinator's ``resource-status`` annotation, ``reservedCPUs`` and NodeResourceTopology use too.

Format (``Documentation/admin-guide/cgroup-v1/cpusets.rst``, "ASCII comma separated list of
decimal numbers and ranges"; parsed by ``bitmap_parselist`` in ``lib/bitmap.c``): elements are
``N`` or ``N-M`` with ``N <= M``, separated by commas. As the kernel does, whitespace (a file's
trailing newline) and empty elements between commas are skipped, so ``""``, ``"\\n"`` and
``"0-1,,4\\n"`` read. Refused, as the kernel and ``k8s.io/utils/cpuset.Parse`` refuse them: a
descending range (``3-1``), a sign, a non-ASCII digit, the kernel's write-only stride form
(``0-7:2/4``). An id above :data:`MAX_CPU_ID` is refused too: no kernel has that many CPUs
(``NR_CPUS`` tops out at 8192), and the bound keeps a hostile annotation from allocating a huge set.

:func:`format_cpulist` is the kernel's and ``cpuset.CPUSet.String()``'s canonical spelling:
ascending, runs of two or more as ``a-b``, nothing for the empty set.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

MAX_CPU_ID = 65535
"""Largest CPU (or NUMA node) id accepted."""

_ELEMENT = re.compile(r"([0-9]+)(?:-([0-9]+))?")


def parse_cpulist(text: str | bytes) -> frozenset[int]:
    """The ids of a cpulist; ``ValueError`` naming the text for anything malformed."""
    if isinstance(text, bytes):
        text = text.decode("ascii", errors="replace")
    ids: set[int] = set()
    for raw in text.split(","):
        part = raw.strip()
        if not part:
            continue
        m = _ELEMENT.fullmatch(part)
        if m is None:
            raise ValueError(f"bad cpulist element {part!r} in {text.strip()!r}")
        low = int(m.group(1))
        high = int(m.group(2)) if m.group(2) is not None else low
        if high < low:
            raise ValueError(f"descending range {part!r} in cpulist {text.strip()!r}")
        if high > MAX_CPU_ID:
            raise ValueError(f"id {high} above {MAX_CPU_ID} in cpulist {text.strip()!r}")
        if low == high:
            ids.add(low)
        else:
            ids.update(range(low, high + 1))
    return frozenset(ids)


def format_cpulist(ids: Iterable[int]) -> str:
    """The canonical cpulist of ``ids``: ``{0, 1, 2, 3, 8}`` → ``"0-3,8"``."""
    if not ids:  # an empty set (a falsy iterable is an empty one); cpusuppress, every round
        return ""
    ordered = sorted(set(ids))
    parts: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts)
