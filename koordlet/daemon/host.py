"""What the daemon does to its own process and watches on the host outside its components: the
open-file limit raised before the collectors start, the garbage collector settled once ready, and
the cgroup driver re-detected until a kubepods root appears (``--cgroup-driver=auto``).
"""

from __future__ import annotations

import gc
import logging
import os
import resource

from koordlet.system.cgroups import CgroupDriver, kube_root_for
from koordlet.system.host import Host
from koordlet.system.paths import HostPaths

logger = logging.getLogger(__name__)

NOFILE_TARGET = 1 << 20
"""Open files the daemon asks for (soft and hard) when it may raise its hard limit: what
containerd gives a container, above systemd's default hard limit for services (524,288)."""


def raise_nofile_limit(paths: HostPaths) -> tuple[int, int]:
    """Raise the open-file limit: the collectors keep ~13 cgroup files per pod open between
    ticks (1,000 pods: 12,757), and the CPI collector holds two descriptors per container and
    CPU (200 containers on 64 CPUs: 25,600). A privileged daemon (root, ``CAP_SYS_RESOURCE``)
    whose hard limit is below :data:`NOFILE_TARGET` raises both limits to it, at most to the
    kernel's ``fs.nr_open``; otherwise the soft limit goes up to the hard one. A koordlet started
    from a shell whose hard limit is 20,000 kept only 10,000 files open at 1,000 pods and opened
    the other 2,757 at every tick (docs/benchmarks.md). Returns (soft, hard) after."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < NOFILE_TARGET:
        want = min(NOFILE_TARGET, _nr_open(paths))
        if want > hard:
            try:
                resource.setrlimit(resource.RLIMIT_NOFILE, (want, want))
            except (ValueError, OSError) as err:  # not privileged: the hard limit stays
                logger.debug("open-file hard limit stays %d (%s)", hard, err)
            else:
                logger.info("open-file limit raised from %d (hard %d) to %d", soft, hard, want)
                return want, want
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError) as err:
            logger.warning("cannot raise the open-file limit from %d to %d: %s", soft, hard, err)
            return soft, hard
        logger.info("open-file limit raised from %d to %d", soft, hard)
    return hard, hard


def _nr_open(paths: HostPaths) -> int:
    """The kernel's ceiling on a process's open-file limit (``fs.nr_open``; 1,048,576 by
    default), or the hard limit's target when it cannot be read."""
    try:
        with open(paths.proc("sys", "fs", "nr_open"), "rb") as f:
            return int(f.read().strip() or NOFILE_TARGET)
    except (OSError, ValueError):
        return NOFILE_TARGET


class DriverWatch:
    """Re-detects the cgroup driver until a kubepods root appears (driver ``auto`` only)."""

    def __init__(self, host: Host, kube_path: str) -> None:
        self._kube_path = kube_path
        layout = host.layout
        self._candidates = tuple(
            layout.abs_dir("cpu", kube_root_for(kube_path, d)) for d in CgroupDriver
        )
        self.pending = not any(os.path.isdir(c) for c in self._candidates)
        if self.pending:
            logger.warning(
                "no kubepods root yet (%s); re-detecting the cgroup driver until one appears",
                " or ".join(self._candidates),
            )

    def check(self, host: Host) -> Host | None:
        """The host with the re-detected layout once a kubepods root exists; else None."""
        if not self.pending or not any(os.path.isdir(c) for c in self._candidates):
            return None
        self.pending = False
        new = Host.detect(host.paths, version=host.layout.version, kube_path=self._kube_path)
        logger.info(
            "kubepods root appeared: cgroup driver %s, kubepods root %s",
            new.layout.driver,
            new.layout.kube_root,
        )
        return new


GC_GEN0_THRESHOLD = 20_000
"""Allocations between young-generation collections once started (CPython's default is 700).
A tick allocates thousands of short-lived, acyclic objects (samples, parsed values) that
reference counting frees; collecting every 700 allocations only re-scans live ones."""


def settle_gc() -> None:
    """Once every stage has started: collect, move what survived (modules, config, the tables,
    open kernel files) out of the collector's reach with ``gc.freeze`` so full collections no
    longer re-scan it, and collect the young generation less often. Measured at 200 pods: the
    collector's own time fell from 145 ms to none in 40 s (two full collections of 50 ms)."""
    gc.collect()
    gc.freeze()
    gen0, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(max(gen0, GC_GEN0_THRESHOLD), gen1, gen2)
