"""Where the host's pseudo file systems are: injected everywhere, never a literal ``/proc``."""

from __future__ import annotations

import os

from apis.records import frozen


@frozen
class HostPaths:
    """Roots of the host file systems the koordlet reads and writes.

    Mirrors Koordinator's ``--cgroup-root-dir``, ``--proc-root-dir``, ``--sys-root-dir`` and
    ``--var-lib-kubelet-dir``; in a
    container these point at the host's mounts, in tests at a temporary tree.
    """

    cgroup_root: str = "/sys/fs/cgroup"
    """Mount point of the cgroup hierarchies (v1: one folder per controller; v2: unified)."""
    proc_root: str = "/proc"
    """The host's procfs."""
    sys_root: str = "/sys"
    """The host's sysfs (CPU topology, NUMA nodes, resctrl under ``fs/resctrl``)."""
    kubelet_root: str = "/var/lib/kubelet"
    """The kubelet's root directory (pod volumes under ``pods/<uid>/volumes``); Koordinator's
    ``--var-lib-kubelet-dir``."""

    def proc(self, *parts: str) -> str:
        """A path under the procfs root."""
        return os.path.join(self.proc_root, *parts)

    def sys(self, *parts: str) -> str:
        """A path under the sysfs root."""
        return os.path.join(self.sys_root, *parts)

    def kubelet(self, *parts: str) -> str:
        """A path under the kubelet's root directory."""
        return os.path.join(self.kubelet_root, *parts)

    def cgroup(self, *parts: str) -> str:
        """A path under the cgroup mount root (callers normally use ``CgroupLayout``)."""
        return os.path.join(self.cgroup_root, *parts)
