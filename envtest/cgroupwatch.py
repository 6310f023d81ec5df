"""What a container's cgroup holds the moment it appears: a thread lists the pod folders of a
QoS cgroup every millisecond and reads each new container folder's limits at once, so a test
can tell values written at creation from values a later reconcile wrote."""

from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from envtest.cluster import Node

UNSET_QUOTA = -1
UNSET_MEMORY = 9223372036854771712
"""memory.limit_in_bytes of a v1 cgroup without a limit (PAGE_COUNTER_MAX pages, 4 KiB)."""


@dataclass
class Seen:
    """One container folder: when it appeared and what it held at the first read."""

    appeared: float
    first_quota: int
    first_memory: int
    settled: float | None = None
    """When both limits were first non-default (None while default)."""
    quota: int = UNSET_QUOTA
    memory: int = UNSET_MEMORY


def read_int(path: Path) -> int:
    return int(path.read_text().split()[0])


@dataclass
class CgroupWatch:
    node: Node
    qos: str = "besteffort"
    seen: dict[str, Seen] = field(default_factory=dict)
    """Container folder name -> what was seen."""
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> CgroupWatch:
        self._known = {p.name for p in self._containers()}
        self._thread = threading.Thread(target=self._run, name="cgroupwatch", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)

    def _containers(self) -> list[Path]:
        top = self.node.cgroup("cpu", "kubepods", self.qos)
        out: list[Path] = []
        with contextlib.suppress(OSError):
            for pod in top.iterdir():
                if pod.is_dir() and pod.name.startswith("pod"):
                    with contextlib.suppress(OSError):
                        out.extend(c for c in pod.iterdir() if c.is_dir())
        return out

    def _run(self) -> None:
        pending: dict[str, tuple[Path, Path]] = {}
        while not self._stop.is_set():
            for cpu_dir in self._containers():
                if cpu_dir.name in self._known:
                    continue
                now = time.monotonic()
                self._known.add(cpu_dir.name)
                rel = cpu_dir.relative_to(self.node.cgroup("cpu"))
                mem_dir = self.node.cgroup("memory") / rel
                with contextlib.suppress(OSError, ValueError):
                    q, m = (
                        read_int(cpu_dir / "cpu.cfs_quota_us"),
                        read_int(mem_dir / "memory.limit_in_bytes"),
                    )
                    self.seen[cpu_dir.name] = Seen(now, q, m)
                    pending[cpu_dir.name] = (cpu_dir, mem_dir)
            for name, (cpu_dir, mem_dir) in list(pending.items()):
                s = self.seen[name]
                with contextlib.suppress(OSError, ValueError):
                    s.quota = read_int(cpu_dir / "cpu.cfs_quota_us")
                    s.memory = read_int(mem_dir / "memory.limit_in_bytes")
                if s.quota != UNSET_QUOTA and s.memory != UNSET_MEMORY:
                    s.settled = time.monotonic()
                    del pending[name]
                elif time.monotonic() - s.appeared > 30:
                    del pending[name]
            time.sleep(0.001)
