"""Cold memory from DAMON: our kdamond's cold regions, their pages' memory cgroups by kpagecgroup.

The cold-page source for mainline kernels (kidled, ``koordlet.system.kidled``, is Anolis-only).
:class:`DamonColdPageSource` starts our kdamond on first use (``koordlet.system.damon``: claim,
busy, clean-up rules), and every ``refresh_interval`` seconds takes a *snapshot*: the regions
that had no access for the cold age, and the pages of those regions counted per memory cgroup
inode (``koordlet.system.kpagecgroup``). Between snapshots every step answers from the last one;
the gap grows past ``refresh_interval`` when a snapshot is expensive (``cpu_budget``).

- **node**: every cold page charged to some memory cgroup (free and uncharged kernel pages are
  not memory in use and are left out, as kidled's root histogram leaves them out);
- **a cgroup** (pod, container, host application): the cold pages charged to it or to any cgroup
  below it, as kidled's hierarchical ``memory.idle_page_stats`` counts them.

Until the kdamond has watched for one cold age no region can be cold yet: the source says so as
unsupported ("warming up") rather than reporting 0. docs/coldmemory.md compares this with DAMOS
``memcg`` filters and gives the measured cost.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping

from koordlet.errors import CgroupGoneError, HostError, ParseError, UnsupportedError
from koordlet.system.cgroups import CgroupLayout
from koordlet.system.damon import (
    DamonAttrs,
    Kdamond,
    RealSysfs,
    Region,
    SysfsIO,
    admin_dir,
    claim_path,
)
from koordlet.system.kpagecgroup import PAGE_SIZE, pages_of, subtree_inodes, tally
from koordlet.system.paths import HostPaths

logger = logging.getLogger(__name__)

DEFAULT_REFRESH_INTERVAL = 60.0
"""Least seconds between snapshots."""
DEFAULT_CPU_BUDGET = 0.004
"""Share of one core our snapshots may use on average: after a snapshot that cost ``c`` seconds
of CPU the next waits ``max(refresh_interval, c / cpu_budget)`` (docs/coldmemory.md: the
kpagecgroup read dominates, about 0.5 s a snapshot of 24 GiB here, so every ~2 minutes)."""

Reader = Callable[[str], bytes]


class DamonColdPageSource:
    """Cold bytes of memory cgroups from our kdamond (module docstring).

    :param layout: the cgroup layout (each memcg's folder).
    :param paths: host roots (``/sys/kernel/mm/damon``, ``/proc/kpagecgroup``, ``/proc/iomem``).
    :param state_dir: the koordlet's state directory (the claim file).
    :param attrs: the kdamond's settings, the cold age among them.
    :param refresh_interval: least seconds between snapshots.
    :param cpu_budget: share of a core the snapshots may use on average (stretches the gap).
    :param io: the DAMON admin folder (tests: a fake kernel); the real one by default.
    :param clock: monotonic seconds (tests inject one).
    """

    name = "damon"

    def __init__(
        self,
        layout: CgroupLayout,
        paths: HostPaths,
        state_dir: str,
        *,
        attrs: DamonAttrs | None = None,
        refresh_interval: float = DEFAULT_REFRESH_INTERVAL,
        cpu_budget: float = DEFAULT_CPU_BUDGET,
        io: SysfsIO | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._layout = layout
        self._proc_root = paths.proc_root
        self._clock = clock
        self.refresh_interval = refresh_interval
        self.cpu_budget = cpu_budget
        self._gap = refresh_interval
        self._snapshot_cpu = 0.0
        self.kdamond = Kdamond(
            io or RealSysfs(admin_dir(paths.sys_root)),
            claim_path(state_dir),
            paths.proc_root,
            attrs or DamonAttrs(),
        )
        self._started_at: float | None = None
        self._taken_at: float | None = None
        self._counts: dict[int, int] = {}
        self._regions = 0
        self._region_bytes = 0
        self.regions: list[Region] = []
        """The cold regions of the last snapshot."""
        self._inodes: dict[str, set[int]] = {}

    @property
    def attrs(self) -> DamonAttrs:
        return self.kdamond.attrs

    def _ensure_started(self) -> float:
        if not self.kdamond.running:
            self._started_at = None
            self._taken_at = None
            self.kdamond.start()
            self._started_at = self._clock()
        assert self._started_at is not None
        return self._started_at

    def refresh(self) -> None:
        """Take a snapshot now (blocks up to one apply interval, then reads kpagecgroup)."""
        cpu = time.thread_time()
        try:
            regions = self.kdamond.cold_regions()
        except UnsupportedError:  # a HostError too, but already the right answer
            raise
        except (HostError, ParseError) as err:
            # Someone stopped ours, or the folder went away: start over at the next step.
            self.kdamond.stop()
            raise UnsupportedError("damon", f"our kdamond failed, restarting: {err}") from err
        self._counts = tally(self._proc_root, ((r.start, r.end) for r in regions))
        self.regions = regions
        self._regions = len(regions)
        self._region_bytes = sum(r.size for r in regions)
        self._inodes = {}
        self._taken_at = self._clock()
        self._snapshot_cpu = time.thread_time() - cpu
        self._gap = max(self.refresh_interval, self._snapshot_cpu / self.cpu_budget)

    def check(self, read: Reader) -> Mapping[str, object]:
        started = self._ensure_started()
        now = self._clock()
        watched = now - started
        if watched < self.attrs.cold_age_s:
            raise UnsupportedError(
                "damon",
                f"warming up: a page is cold after {self.attrs.cold_age_s:g}s without access, "
                f"our kdamond has watched for {watched:.0f}s",
            )
        if self._taken_at is None or now - self._taken_at >= self._gap:
            self.refresh()
        assert self._taken_at is not None
        return {
            "source": self.name,
            "kdamond_pid": self.kdamond.pid,
            "cold_age_seconds": self.attrs.cold_age_s,
            "sample_us": self.attrs.sample_us,
            "aggr_us": self.attrs.aggr_us,
            "max_regions": self.attrs.max_regions,
            "cold_regions": self._regions,
            "cold_region_bytes": self._region_bytes,
            "snapshot_age_seconds": round(now - self._taken_at, 3),
            "snapshot_cpu_ms": round(self._snapshot_cpu * 1000, 1),
            "next_snapshot_after_seconds": round(self._gap, 1),
        }

    def cold_bytes(self, read: Reader, cgroup_rel: str) -> int:
        if not cgroup_rel:
            return sum(self._counts.values()) * PAGE_SIZE
        inodes = self._inodes.get(cgroup_rel)
        if inodes is None:
            inodes = subtree_inodes(self._layout.abs_dir("memory", cgroup_rel))
            if not inodes:
                raise CgroupGoneError(f"memory cgroup {cgroup_rel} does not exist")
            self._inodes[cgroup_rel] = inodes
        return pages_of(self._counts, inodes) * PAGE_SIZE

    def close(self) -> None:
        """Stop and remove our kdamond (and its claim file)."""
        self.kdamond.stop()
