"""A fake DAMON sysfs interface: the real folder layout and file formats, and the kernel's answers.

:class:`FakeDamon` keeps the tree in a temporary folder, laid out as Linux 6.18 lays out
``/sys/kernel/mm/damon/admin`` (captured on this machine: ``tests/golden/damon/tree-6.18.txt``),
every file holding what the kernel prints (a number or word and a newline). It implements
``koordlet.system.damon.SysfsIO``, and its ``write`` does what ``mm/damon/sysfs.c`` does:

- ``nr_kdamonds``: ``EBUSY`` while any kdamond runs; else every folder removed and that many
  pristine ones made (``damon_sysfs_kdamonds_add_dirs``);
- ``nr_contexts``, ``nr_targets``, ``nr_regions``, ``nr_schemes``: the children remade with the
  kernel's defaults;
- ``state``: ``on`` (``EBUSY`` when on; ``EINVAL`` without exactly one context, with operations
  not in ``avail_operations``, with several paddr targets, or with bad intervals or region
  bounds) gives the kdamond a pid; ``off`` (``EINVAL`` when never started);
  ``update_schemes_tried_regions`` fills each scheme's ``tried_regions`` with the fake's
  monitoring regions (:attr:`FakeDamon.regions`) that match its access pattern;
  ``clear_schemes_tried_regions`` empties them; any other word: ``EINVAL``.

Options model older kernels: ``tried_regions=False`` (before 6.2), ``apply_interval=False``
(before 6.7), ``avail`` the operations set built in. :meth:`FakeDamon.add_foreign` puts
someone else's kdamond in the array. ``writes`` records every write, to assert on what was
(not) touched.
"""

from __future__ import annotations

import errno
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from koordlet.system.damon import Region, io_error

GOLDEN = Path(__file__).parent / "golden" / "damon"

_KDAMOND = {"state": "off", "pid": "-1", "refresh_ms": "0"}
_CONTEXT = {
    "operations": "vaddr",
    "addr_unit": "1",
    "monitoring_attrs/intervals/sample_us": "5000",
    "monitoring_attrs/intervals/aggr_us": "100000",
    "monitoring_attrs/intervals/update_us": "1000000",
    "monitoring_attrs/intervals/intervals_goal/access_bp": "0",
    "monitoring_attrs/intervals/intervals_goal/aggrs": "0",
    "monitoring_attrs/intervals/intervals_goal/min_sample_us": "0",
    "monitoring_attrs/intervals/intervals_goal/max_sample_us": "0",
    "monitoring_attrs/nr_regions/min": "10",
    "monitoring_attrs/nr_regions/max": "1000",
    "targets/nr_targets": "0",
    "schemes/nr_schemes": "0",
}
_SCHEME = {
    "action": "stat",
    "apply_interval_us": "0",
    "target_nid": "-1",
    "access_pattern/sz/min": "0",
    "access_pattern/sz/max": "0",
    "access_pattern/nr_accesses/min": "0",
    "access_pattern/nr_accesses/max": "0",
    "access_pattern/age/min": "0",
    "access_pattern/age/max": "0",
    "quotas/ms": "0",
    "quotas/bytes": "0",
    "quotas/reset_interval_ms": "0",
    "quotas/effective_bytes": "0",
    "quotas/goals/nr_goals": "0",
    "quotas/weights/sz_permil": "0",
    "quotas/weights/nr_accesses_permil": "0",
    "quotas/weights/age_permil": "0",
    "watermarks/metric": "none",
    "watermarks/interval_us": "0",
    "watermarks/high": "0",
    "watermarks/mid": "0",
    "watermarks/low": "0",
    "filters/nr_filters": "0",
    "core_filters/nr_filters": "0",
    "ops_filters/nr_filters": "0",
    "dests/nr_dests": "0",
    "stats/nr_tried": "0",
    "stats/sz_tried": "0",
    "stats/nr_applied": "0",
    "stats/sz_applied": "0",
    "stats/sz_ops_filter_passed": "0",
    "stats/qt_exceeds": "0",
    "tried_regions/total_bytes": "0",
}


@dataclass
class FakeDamon:
    """The fake interface rooted at ``root`` (made empty: ``nr_kdamonds`` 0)."""

    root: str
    avail: tuple[str, ...] = ("paddr",)
    tried_regions: bool = True
    apply_interval: bool = True
    regions: list[Region] = field(default_factory=list)
    """What the kdamonds have "monitored": reported by ``update_schemes_tried_regions``."""
    writes: list[tuple[str, str]] = field(default_factory=list)
    next_pid: int = 4242
    _running: dict[int, bool] = field(default_factory=dict)
    _started: dict[int, bool] = field(default_factory=dict)

    def __post_init__(self) -> None:
        os.makedirs(os.path.join(self.root, "kdamonds"), exist_ok=True)
        self._put("kdamonds/nr_kdamonds", "0")

    # SysfsIO ---------------------------------------------------------------------------------

    def _p(self, rel: str) -> str:
        return os.path.join(self.root, rel)

    def read(self, rel: str) -> str:
        try:
            with open(self._p(rel)) as f:
                return f.read()
        except OSError as err:
            raise io_error(self._p(rel), err, "reading") from err

    def listdir(self, rel: str) -> list[str]:
        try:
            return os.listdir(self._p(rel))
        except OSError as err:
            raise io_error(self._p(rel), err, "listing") from err

    def exists(self, rel: str) -> bool:
        return os.path.exists(self._p(rel))

    def write(self, rel: str, value: str) -> None:
        if not os.path.isfile(self._p(rel)):
            self._fail(rel, errno.ENOENT, value)
        self.writes.append((rel, value))
        parts = rel.split("/")
        name = parts[-1]
        if rel == "kdamonds/nr_kdamonds":
            self._nr_kdamonds(int(value))
        elif name == "state":
            self._state(rel, int(parts[1]), value.strip())
        elif name in ("nr_contexts", "nr_targets", "nr_regions", "nr_schemes"):
            self._children(os.path.dirname(rel), name, int(value))
        elif name in ("pid", "avail_operations", "total_bytes") or "stats" in parts:
            self._fail(rel, errno.EACCES, value)
        else:
            self._put(rel, value.strip())

    # the kernel's reactions -----------------------------------------------------------------

    def _fail(self, rel: str, code: int, value: str) -> None:
        raise io_error(self._p(rel), OSError(code, os.strerror(code)), f"writing {value!r}")

    def _put(self, rel: str, value: str) -> None:
        path = self._p(rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(f"{value}\n")

    def _fill(self, base: str, files: dict[str, str]) -> None:
        for rel, value in files.items():
            self._put(os.path.join(base, rel), value)

    def _nr_kdamonds(self, count: int) -> None:
        if any(self._running.values()):
            self._fail("kdamonds/nr_kdamonds", errno.EBUSY, str(count))
        base = self._p("kdamonds")
        for name in os.listdir(base):
            if name.isdigit():
                shutil.rmtree(os.path.join(base, name))
        self._running.clear()
        self._started.clear()
        for i in range(count):
            self._fill(f"kdamonds/{i}", _KDAMOND)
            self._put(f"kdamonds/{i}/contexts/nr_contexts", "0")
        self._put("kdamonds/nr_kdamonds", str(count))

    def _children(self, parent: str, name: str, count: int) -> None:
        base = self._p(parent)
        for entry in os.listdir(base):
            if entry.isdigit():
                shutil.rmtree(os.path.join(base, entry))
        for i in range(count):
            d = os.path.join(parent, str(i))
            if name == "nr_contexts":
                self._fill(d, _CONTEXT)
                self._put(os.path.join(d, "avail_operations"), "\n".join(self.avail))
            elif name == "nr_targets":
                self._fill(d, {"pid_target": "0", "regions/nr_regions": "0"})
            elif name == "nr_regions":
                self._fill(d, {"start": "0", "end": "0"})
            else:
                files = dict(_SCHEME)
                if not self.tried_regions:
                    files = {k: v for k, v in files.items() if not k.startswith("tried_regions")}
                if not self.apply_interval:
                    del files["apply_interval_us"]
                self._fill(d, files)
        self._put(os.path.join(parent, name), str(count))

    def _int(self, rel: str) -> int:
        return int(self.read(rel))

    def _state(self, rel: str, index: int, cmd: str) -> None:
        kd = f"kdamonds/{index}"
        running = self._running.get(index, False)
        if cmd == "on":
            if running:
                self._fail(rel, errno.EBUSY, cmd)
            self._check_startable(rel, kd, cmd)
            self._running[index] = self._started[index] = True
            self._put(f"{kd}/state", "on")
            self._put(f"{kd}/pid", str(self.next_pid))
            self.next_pid += 1
        elif cmd == "off":
            if not self._started.get(index):
                self._fail(rel, errno.EINVAL, cmd)
            self._running[index] = False
            self._put(f"{kd}/state", "off")
            self._put(f"{kd}/pid", "-1")
        elif cmd == "update_schemes_tried_regions":
            if not running:
                self._fail(rel, errno.EINVAL, cmd)
            self._tried_regions(kd)
        elif cmd == "clear_schemes_tried_regions":
            self._tried_regions(kd, clear=True)
        else:
            self._fail(rel, errno.EINVAL, cmd)

    def _check_startable(self, rel: str, kd: str, cmd: str) -> None:
        if self._int(f"{kd}/contexts/nr_contexts") != 1:
            self._fail(rel, errno.EINVAL, cmd)
        ctx = f"{kd}/contexts/0"
        ops = self.read(f"{ctx}/operations").strip()
        if ops not in self.avail:
            self._fail(rel, errno.EINVAL, cmd)
        if ops == "paddr" and self._int(f"{ctx}/targets/nr_targets") > 1:
            self._fail(rel, errno.EINVAL, cmd)
        attrs = f"{ctx}/monitoring_attrs"
        if self._int(f"{attrs}/intervals/sample_us") > self._int(f"{attrs}/intervals/aggr_us"):
            self._fail(rel, errno.EINVAL, cmd)
        lo, hi = self._int(f"{attrs}/nr_regions/min"), self._int(f"{attrs}/nr_regions/max")
        if lo < 3 or hi < lo:
            self._fail(rel, errno.EINVAL, cmd)

    def _tried_regions(self, kd: str, *, clear: bool = False) -> None:
        schemes = f"{kd}/contexts/0/schemes"
        for s in range(self._int(f"{schemes}/nr_schemes")):
            base = f"{schemes}/{s}"
            tried = self._p(f"{base}/tried_regions")
            if not os.path.isdir(tried):
                continue
            for entry in os.listdir(tried):
                if entry.isdigit():
                    shutil.rmtree(os.path.join(tried, entry))
            matched = [] if clear else [r for r in self.regions if self._matches(base, r)]
            for i, r in enumerate(matched):
                self._fill(
                    f"{base}/tried_regions/{i}",
                    {
                        "start": str(r.start),
                        "end": str(r.end),
                        "nr_accesses": str(r.nr_accesses),
                        "age": str(r.age),
                        "sz_filter_passed": "0",
                    },
                )
            self._put(f"{base}/tried_regions/total_bytes", str(sum(r.size for r in matched)))

    def _matches(self, scheme: str, r: Region) -> bool:
        def within(name: str, value: int) -> bool:
            pattern = f"{scheme}/access_pattern/{name}"
            return self._int(f"{pattern}/min") <= value <= self._int(f"{pattern}/max")

        sz, acc = within("sz", r.size), within("nr_accesses", r.nr_accesses)
        return sz and acc and within("age", r.age)

    # test helpers ----------------------------------------------------------------------------

    def add_foreign(self, *, running: bool) -> None:
        """Someone else's kdamond 0 (paddr, a pageout scheme), running or set up and off."""
        self._nr_kdamonds(1)
        self._children("kdamonds/0/contexts", "nr_contexts", 1)
        ctx = "kdamonds/0/contexts/0"
        self._put(f"{ctx}/operations", "paddr")
        self._children(f"{ctx}/targets", "nr_targets", 1)
        self._children(f"{ctx}/schemes", "nr_schemes", 1)
        self._put(f"{ctx}/schemes/0/action", "pageout")
        if running:
            self._put(f"{ctx}/monitoring_attrs/nr_regions/min", "10")
            self._state("kdamonds/0/state", 0, "on")
        self.writes.clear()

    def stop_all(self) -> None:
        """What a reboot or the other user does: every kdamond off."""
        for index, running in list(self._running.items()):
            if running:
                self._state(f"kdamonds/{index}/state", index, "off")

    def snapshot(self) -> dict[str, str]:
        """Every file and its content, to compare before and after."""
        out = {}
        for dirpath, _, files in os.walk(self.root):
            for name in files:
                path = os.path.join(dirpath, name)
                with open(path) as f:
                    out[os.path.relpath(path, self.root)] = f.read()
        return out
