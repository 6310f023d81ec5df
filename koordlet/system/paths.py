"""Where the host's pseudo file systems are: injected everywhere, never a literal ``/proc``."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class HostPaths:
    """Roots of the host file systems the koordlet reads and writes.

    Mirrors Koordinator's ``--cgroup-root-dir``, ``--proc-root-dir`` and ``--sys-root-dir``; in a
    container these point at the host's mounts, in tests at a temporary tree.
    """

    cgroup_root: str = "/sys/fs/cgroup"
    """Mount point of the cgroup hierarchies (v1: one folder per controller; v2: unified)."""
    proc_root: str = "/proc"
    """The host's procfs."""
    sys_root: str = "/sys"
    """The host's sysfs (CPU topology, NUMA nodes, resctrl under ``fs/resctrl``)."""

    def proc(self, *parts: str) -> str:
        """A path under the procfs root."""
        return os.path.join(self.proc_root, *parts)

    def sys(self, *parts: str) -> str:
        """A path under the sysfs root."""
        return os.path.join(self.sys_root, *parts)

    def cgroup(self, *parts: str) -> str:
        """A path under the cgroup mount root (callers normally use ``CgroupLayout``)."""
        return os.path.join(self.cgroup_root, *parts)
