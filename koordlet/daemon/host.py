"""What the daemon does to its own process and watches on the host outside its components: the
open-file limit raised before the collectors start, the garbage collector settled once ready,
the cgroup driver re-detected until a kubepods root appears (``--cgroup-driver=auto``), and the
capabilities the start-up probe found re-checked while running (:class:`CapabilityWatch`).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import resource
from collections.abc import Callable, Iterator, Mapping

from koordlet.prom import GaugeMetricFamily, Metric
from koordlet.system.cgroups import CgroupDriver, kube_root_for
from koordlet.system.host import Host
from koordlet.system.paths import HostPaths
from koordlet.system.probe import Capabilities, probe_capabilities

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


async def recheck_capabilities(watch: CapabilityWatch) -> None:
    """One round of the ``capabilities`` loop: re-probe in a worker thread."""
    await asyncio.to_thread(watch.recheck)


CAPABILITY_RECHECK = 300.0
"""Seconds between two re-probes of the host's capabilities (a probe reads ~50 files: ~30 ms)."""


class CapabilityWatch:
    """What the host could do at start and no longer can: a capability the start-up probe found
    supported that a re-probe finds unsupported (resctrl unmounted, a controller detached, PSI
    switched off), and a pressure watch armed once that the host refuses when armed again.

    :meth:`recheck` (the ``capabilities`` loop, every :data:`CAPABILITY_RECHECK` seconds, in a
    worker thread) re-probes; :meth:`lost` names what is lost with the reason;
    ``koordlet_capability_lost{name}`` is 1 for each (a Prometheus collector, fresh per scrape;
    the alert ``KoordletCapabilityLost``) and ``koordlet_capability_supported`` follows the
    re-probe. What the daemon does keeps using the start-up verdicts; a lost one shows in
    ``/debug/capabilities`` with ``"lost": true``.

    :param host: the current layout (re-detected with ``--cgroup-driver=auto``).
    :param at_start: the start-up probe's verdicts.
    :param watches_lost: the pressure event source's lost watches (empty without one).
    :param publish: sets ``koordlet_capability_supported`` from a probe (the self metrics).
    """

    def __init__(
        self,
        host: Callable[[], Host],
        at_start: Capabilities,
        *,
        watches_lost: Callable[[], Mapping[str, str]] = dict,
        publish: Callable[[Mapping[str, bool]], None] | None = None,
    ) -> None:
        self._host = host
        self.at_start = at_start
        self._watches_lost = watches_lost
        self._publish = publish
        self._probe_lost: dict[str, str] = {}

    def recheck(self) -> dict[str, str]:
        """Probe again (blocking: call it in a worker thread); what is lost now."""
        now = probe_capabilities(self._host())
        lost = {
            name: cap.reason or "unsupported"
            for name, cap in now.items()
            if not cap.supported and self.at_start.supported(name)
        }
        for name in sorted(lost.keys() - self._probe_lost.keys()):
            logger.warning("capability %s lost since start: %s", name, lost[name])
        for name in sorted(self._probe_lost.keys() - lost.keys()):
            logger.info("capability %s supported again", name)
        self._probe_lost = lost
        if self._publish is not None:
            self._publish({name: cap.supported for name, cap in now.items()})
        return self.lost()

    def lost(self) -> dict[str, str]:
        """Capability (``events/<watch>`` for a pressure watch) → why it is lost."""
        out = dict(self._probe_lost)
        out.update({f"events/{name}": why for name, why in self._watches_lost().items()})
        return out

    def describe(self) -> list[Metric]:
        return list(self._families({}))

    def collect(self) -> Iterator[Metric]:
        return self._families(self.lost())

    @staticmethod
    def _families(lost: Mapping[str, str]) -> Iterator[Metric]:
        family = GaugeMetricFamily(
            "koordlet_capability_lost",
            "1 for a capability the host had at start and has lost (a re-probe finds it "
            "unsupported, or a pressure watch armed once is refused); absent otherwise.",
            labels=("name",),
        )
        for name in sorted(lost):
            family.add_metric((name,), 1.0)
        yield family
