"""The DAMON cold-page source on this machine's real kernel (6.18: DAMON sysfs, paddr,
``/proc/kpagecgroup``, cgroup v1).

A test memory cgroup ``kpytest-<hex>/pod/ctr`` (removed afterwards) holds a process that touches
512 MiB once and then only a 16 MiB hot set. What runs depends on the DAMON interface:

- always: ``/proc/kpagecgroup`` charges the 512 MiB to that cgroup (and so to the pod and to the
  node), read over the whole of System RAM, as the source reads it over cold regions;
- DAMON held by a kdamond that is not ours (this machine's own, started at boot): the source
  says busy and leaves the interface exactly as it was;
- DAMON free: with a 3 s cold age, the 512 MiB are reported cold within 20 %, no page of the hot
  set lies in a cold region, the node figure includes them, and nothing of ours is left in
  ``/sys/kernel/mm/damon/admin`` after stop, nor after a SIGKILLed koordlet process and the
  next start's clean-up.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from koordlet.errors import UnsupportedError
from koordlet.system.cgroups import CgroupVersion, detect_layout
from koordlet.system.damon import (
    DamonAttrs,
    DamonBusyError,
    RealSysfs,
    admin_dir,
    clean_stale_kdamond,
    kdamond_states,
    system_ram_ranges,
)
from koordlet.system.damoncold import DamonColdPageSource
from koordlet.system.kpagecgroup import PAGE_SIZE, pages_of, subtree_inodes, tally
from koordlet.system.paths import HostPaths

PATHS = HostPaths()
MEMCG = PATHS.cgroup("memory")
MiB = 1 << 20
TOUCHED = 512 * MiB
HOT = 16 * MiB
ATTRS = DamonAttrs(
    sample_us=20_000, aggr_us=200_000, apply_us=200_000, min_regions=10, cold_age_s=3.0
)

ADMIN = admin_dir(PATHS.sys_root)


def _unavailable() -> str | None:
    if os.geteuid() != 0:
        return "needs root"
    if not os.path.isfile(os.path.join(MEMCG, "tasks")):
        return "needs the cgroup v1 memory hierarchy"
    if not os.path.isdir(ADMIN):
        return "kernel without DAMON sysfs"
    if not os.access(PATHS.proc("kpagecgroup"), os.R_OK):
        return "no readable /proc/kpagecgroup"
    return None


def _damon_held() -> str | None:
    """Why our own kdamond cannot run here (the kdamonds present), or None."""
    states = kdamond_states(RealSysfs(ADMIN))
    if not states:
        return None
    listed = ", ".join(f"kdamond {i} {s}" for i, s in enumerate(states))
    return f"DAMON sysfs holds kdamonds that are not ours ({listed})"


pytestmark = [
    pytest.mark.realcgroup,
    pytest.mark.skipif(_unavailable() is not None, reason=str(_unavailable())),
]

CHILD = textwrap.dedent(
    """
    import ctypes, sys, time
    sys.stdin.readline()                      # moved into the cgroup: go
    cold = bytearray({touched})
    for i in range(0, len(cold), 4096):
        cold[i] = 1
    hot = bytearray({hot})
    for i in range(0, len(hot), 4096):
        hot[i] = 1
    print(ctypes.addressof((ctypes.c_char * len(hot)).from_buffer(hot)), flush=True)
    while True:                               # only the hot set from now on
        for i in range(0, len(hot), 4096):
            hot[i] = (hot[i] + 1) & 0xff
        time.sleep(0.005)
    """
)


@dataclass
class Toucher:
    rel: str
    pod_rel: str
    proc: subprocess.Popen[str]
    hot_address: int
    """Virtual address of the hot set in the process."""


@pytest.fixture
def toucher() -> Iterator[Toucher]:
    top = f"kpytest-{secrets.token_hex(4)}"
    pod_rel, rel = f"{top}/pod", f"{top}/pod/ctr"
    os.makedirs(os.path.join(MEMCG, rel))
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD.format(touched=TOUCHED, hot=HOT)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        with open(os.path.join(MEMCG, rel, "cgroup.procs"), "w") as f:
            f.write(str(proc.pid))
        assert proc.stdin is not None
        assert proc.stdout is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
        address = int(proc.stdout.readline())  # touched everything
        yield Toucher(rel, pod_rel, proc, address)
    finally:
        proc.kill()
        proc.communicate()  # reaps it and closes its pipes
        for d in (rel, pod_rel, top):
            for _ in range(50):  # rmdir fails while the dead task's pages are still charged
                try:
                    os.rmdir(os.path.join(MEMCG, d))
                    break
                except OSError:
                    time.sleep(0.05)


def test_kpagecgroup_charges_the_touched_pages_to_the_cgroup_its_pod_and_the_node(
    toucher: Toucher,
) -> None:
    counts = tally(PATHS.proc_root, system_ram_ranges(PATHS.proc_root))

    ctr = pages_of(counts, subtree_inodes(os.path.join(MEMCG, toucher.rel))) * PAGE_SIZE
    pod = pages_of(counts, subtree_inodes(os.path.join(MEMCG, toucher.pod_rel))) * PAGE_SIZE
    usage = int(Path(MEMCG, toucher.pod_rel, "memory.usage_in_bytes").read_text())
    node = sum(counts.values()) * PAGE_SIZE

    assert TOUCHED + HOT <= ctr <= usage
    assert pod == ctr  # the pod's own folder holds no task
    assert node >= pod


def _source(state_dir: Path) -> DamonColdPageSource:
    layout = detect_layout(PATHS, version=CgroupVersion.V1)
    return DamonColdPageSource(
        layout, PATHS, str(state_dir), attrs=ATTRS, refresh_interval=0.0, cpu_budget=1.0
    )


def _interface() -> tuple[str, list[str]]:
    io = RealSysfs(ADMIN)
    return io.read("kdamonds/nr_kdamonds"), kdamond_states(io)


@pytest.mark.skipif(
    _damon_held() is None, reason="DAMON is free here: the busy path needs a kdamond not ours"
)
def test_a_damon_held_by_a_kdamond_not_ours_is_busy_and_left_as_it_was(tmp_path: Path) -> None:
    before = _interface()
    source = _source(tmp_path)

    with pytest.raises(DamonBusyError, match=r"^damon unsupported: busy: kdamond 0 (on|off)"):
        source.check(lambda p: b"")
    source.close()

    assert _interface() == before
    assert not os.listdir(tmp_path) or not os.listdir(tmp_path / "damon")


needs_free_damon = pytest.mark.skipif(
    _damon_held() is not None, reason=f"our own kdamond cannot run: {_damon_held()}"
)


def _hot_frames(pid: int, address: int) -> set[int]:
    """Physical frames of the hot set (``/proc/<pid>/pagemap``, root: PFNs shown)."""
    frames = set()
    with open(f"/proc/{pid}/pagemap", "rb") as f:
        for page in range(address // PAGE_SIZE, (address + HOT) // PAGE_SIZE):
            f.seek(page * 8)
            entry = int.from_bytes(f.read(8), "little")
            if entry >> 63:
                frames.add(entry & ((1 << 55) - 1))
    return frames


@needs_free_damon
def test_512_mib_touched_once_are_cold_within_20_percent_and_the_hot_set_never(
    toucher: Toucher, tmp_path: Path
) -> None:
    source = _source(tmp_path)
    try:
        deadline = time.monotonic() + 20.0
        cold = 0
        while time.monotonic() < deadline:
            try:
                source.check(lambda p: b"")
            except UnsupportedError as err:
                if not err.reason.startswith("warming up"):
                    raise
                time.sleep(0.2)
                continue
            cold = source.cold_bytes(lambda p: b"", toucher.pod_rel)
            if cold >= 0.8 * TOUCHED:
                break
            time.sleep(0.2)
        assert 0.8 * TOUCHED <= cold <= 1.2 * TOUCHED
        assert source.cold_bytes(lambda p: b"", "") >= cold
        hot = _hot_frames(toucher.proc.pid, toucher.hot_address)
        assert len(hot) >= HOT // PAGE_SIZE
        cold_frames = [(r.start // PAGE_SIZE, r.end // PAGE_SIZE) for r in source.regions]
        assert not [f for f in hot if any(lo <= f < hi for lo, hi in cold_frames)]
    finally:
        source.close()
    assert _interface() == ("0\n", [])


@needs_free_damon
def test_nothing_of_ours_is_left_after_a_sigkill_and_the_next_start(tmp_path: Path) -> None:
    script = textwrap.dedent(
        f"""
        import sys
        from koordlet.system.cgroups import CgroupVersion, detect_layout
        from koordlet.system.damon import DamonAttrs
        from koordlet.system.damoncold import DamonColdPageSource
        from koordlet.system.paths import HostPaths
        paths = HostPaths()
        source = DamonColdPageSource(
            detect_layout(paths, version=CgroupVersion.V1), paths, {str(tmp_path)!r},
            attrs=DamonAttrs(sample_us=20_000, aggr_us=200_000, apply_us=200_000,
                             min_regions=10, cold_age_s=3.0))
        source.kdamond.start()
        print(source.kdamond.pid, flush=True)
        sys.stdin.readline()
        """
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=str(Path(__file__).parents[2]),
    )
    try:
        assert proc.stdout is not None
        kdamond_pid = int(proc.stdout.readline())
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
    assert kdamond_pid > 0
    assert _interface() == ("1\n", ["on"])  # a killed koordlet leaves its kdamond running

    assert clean_stale_kdamond(PATHS.sys_root, PATHS.proc_root, str(tmp_path))
    assert _interface() == ("0\n", [])
    assert not os.path.exists(tmp_path / "damon" / "kdamond.json")
