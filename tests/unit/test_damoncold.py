"""Cold memory from DAMON on fake hosts of every layout: a fake DAMON kernel reports cold regions,
a fake ``/proc/kpagecgroup`` (the kernel's format: one little-endian 64-bit inode per page frame)
says whose pages they are, and the cold-memory collector turns that into the same series as
kidled's; warming up, busy and refresh cadence."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from apis.extension import KubeQOS
from koordlet.collectors.coldmemory import INFO_KEY, ColdMemoryCollector, choose_source
from koordlet.collectors.runner import TickState
from koordlet.metriccache import series as s
from koordlet.statesinformer.kubepods import KubepodsSource
from koordlet.statesinformer.model import WorkloadSnapshot
from koordlet.system.cgroups import CgroupVersion
from koordlet.system.damon import DamonAttrs, Region, admin_dir
from koordlet.system.damoncold import DamonColdPageSource
from koordlet.system.kidled import KidledColdPageSource
from koordlet.system.kpagecgroup import PAGE_SIZE, tally
from koordlet.system.probe import Capabilities, Capability
from tests.fakedamon import FakeDamon
from tests.fakehost import FakeHost, container_id
from tests.unit.test_damon import write_proc

MiB = 1 << 20
RAM_END = 1 << 30
UID = "0b9d6c52-1f3e-4a7b-8c2d-5e6f7a8b9c0d"
CID = container_id("damon-app")
POD = s.pod_entity(UID)
CONTAINER = s.container_entity(UID, CID)
ATTRS = DamonAttrs(sample_us=10_000, aggr_us=100_000, apply_us=100_000, cold_age_s=3.0)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def charge(proc: str, start: int, size: int, inode: int) -> None:
    """Mark ``size`` bytes of page frames from physical ``start`` as charged to ``inode``."""
    path = os.path.join(proc, "kpagecgroup")
    with open(path, "r+b" if os.path.exists(path) else "w+b") as f:
        f.truncate(max(os.path.getsize(path), RAM_END // PAGE_SIZE * 8))
        f.seek(start // PAGE_SIZE * 8)
        f.write(inode.to_bytes(8, "little") * (size // PAGE_SIZE))


def inode(fake: FakeHost, rel: str) -> int:
    return os.stat(fake.layout.abs_dir("memory", rel)).st_ino


class Rig:
    def __init__(self, fake: FakeHost, tmp: Path) -> None:
        self.fake = fake
        write_proc(Path(fake.paths.proc_root))
        charge(fake.paths.proc_root, 0, RAM_END, 0)
        self.pod, (self.container,) = fake.add_pod(UID, KubeQOS.BURSTABLE, [("containerd", CID)])
        fake.set_meminfo(MemTotal=1024 * 1024, MemFree=256 * 1024)  # kB
        fake.set_memory(self.pod, anon=400 * MiB, file=100 * MiB)
        fake.set_memory(self.container, anon=380 * MiB, file=100 * MiB)
        self.damon = FakeDamon(admin_dir(fake.paths.sys_root))
        self.clock = Clock()
        self.source = DamonColdPageSource(
            fake.layout,
            fake.paths,
            str(tmp / "state"),
            attrs=ATTRS,
            refresh_interval=30.0,
            io=self.damon,
            clock=self.clock,
        )
        self.collector = ColdMemoryCollector(fake.host, 5.0, self.source)
        self.snapshot = WorkloadSnapshot(pods=KubepodsSource(fake.host).list_pods())

    def step(self) -> dict[tuple[str, str], float]:
        result = self.collector.collect(TickState(self.clock.now, self.snapshot))
        self.result = result
        return {(x.key.metric, x.key.entity): x.value for x in result.samples}


@pytest.fixture
def rig(fake_host: FakeHost, tmp_path: Path) -> Rig:
    return Rig(fake_host, tmp_path)


def layout_memory(rig: Rig) -> None:
    """Container: 256 MiB cold and 64 MiB hot; pod itself: 16 MiB cold; another cgroup
    (the kubepods root): 32 MiB cold; 1 MiB of cold free memory."""
    f, p = rig.fake, rig.fake.paths.proc_root
    charge(p, 0x1000_0000, 256 * MiB, inode(f, rig.container))  # 256..512 MiB: cold
    charge(p, 0x2000_0000, 64 * MiB, inode(f, rig.container))  # 512..576 MiB: hot
    charge(p, 0x2400_0000, 16 * MiB, inode(f, rig.pod))  # cold
    charge(p, 0x2500_0000, 32 * MiB, inode(f, f.layout.kube_root))  # cold
    rig.damon.regions = [
        Region(0x1000_0000, 0x2000_0000, 0, 40),
        Region(0x2000_0000, 0x2400_0000, 5, 40),  # accessed: the hot set
        Region(0x2400_0000, 0x2700_0000, 0, 35),  # the last 16 MiB of it free
    ]


def test_cold_bytes_of_node_pod_and_container_come_from_their_pages_in_cold_regions(
    rig: Rig,
) -> None:
    layout_memory(rig)
    with pytest.raises(Exception, match="warming up"):
        rig.source.check(rig.fake.host.paths.proc)  # type: ignore[arg-type]
    rig.clock.now += 3.0

    got = rig.step()

    assert got[(s.CONTAINER_MEMORY_COLD_PAGE, CONTAINER)] == 256 * MiB
    assert got[(s.POD_MEMORY_COLD_PAGE, POD)] == (256 + 16) * MiB  # its subtree
    assert got[(s.NODE_MEMORY_COLD_PAGE, s.NODE)] == (256 + 16 + 32) * MiB  # not free memory
    hot = (400 + 100 - 256 - 16) * MiB
    assert got[(s.POD_MEMORY_WITH_HOT_PAGE_CACHE, POD)] == hot
    assert got[(s.NODE_MEMORY_WITH_HOT_PAGE_CACHE, s.NODE)] == (768 - 304) * MiB
    info = rig.result.info[INFO_KEY]
    assert info["source"] == "damon"
    assert info["cold_regions"] == 2


def test_before_one_cold_age_of_watching_the_step_says_warming_up_not_zero(rig: Rig) -> None:
    layout_memory(rig)

    got = rig.step()

    assert got == {}
    assert rig.result.unsupported["damon"].startswith("warming up: a page is cold after 3s")
    assert rig.source.kdamond.running


def test_snapshots_are_taken_once_per_refresh_interval(rig: Rig) -> None:
    layout_memory(rig)
    rig.step()  # starts the kdamond
    rig.clock.now += 3.0
    assert rig.step()[(s.CONTAINER_MEMORY_COLD_PAGE, CONTAINER)] == 256 * MiB
    updates = lambda: sum(1 for w in rig.damon.writes if w[1] == "update_schemes_tried_regions")  # noqa: E731

    rig.damon.regions = []  # everything got hot; not seen until the next snapshot
    rig.clock.now += 29.0
    assert rig.step()[(s.CONTAINER_MEMORY_COLD_PAGE, CONTAINER)] == 256 * MiB
    rig.clock.now += 1.0
    assert rig.step()[(s.CONTAINER_MEMORY_COLD_PAGE, CONTAINER)] == 0
    assert updates() == 2


def test_a_busy_damon_is_reported_under_the_source_with_the_reason(rig: Rig) -> None:
    rig.damon.add_foreign(running=True)

    got = rig.step()

    assert got == {}
    assert rig.result.unsupported["damon"] == (
        "busy: kdamond 0 on: not ours (DAMON sysfs holds one array for all)"
    )
    assert rig.damon.writes == []


def test_close_stops_our_kdamond_and_leaves_the_array_empty(rig: Rig) -> None:
    rig.step()
    assert rig.source.kdamond.running

    rig.collector.close()

    assert rig.damon.read("kdamonds/nr_kdamonds") == "0\n"
    assert not os.path.exists(rig.source.kdamond.claim_path)


def test_a_cgroup_removed_before_the_step_is_skipped_as_gone(rig: Rig) -> None:
    layout_memory(rig)
    rig.step()  # starts the kdamond
    rig.clock.now += 3.0
    rig.fake.remove_cgroup(rig.container)

    got = rig.step()

    assert (s.CONTAINER_MEMORY_COLD_PAGE, CONTAINER) not in got
    assert (s.POD_MEMORY_COLD_PAGE, POD) in got


def test_kidled_is_chosen_where_probing_found_it_else_damon(
    fake_host: FakeHost, tmp_path: Path
) -> None:
    def caps(kidled: bool, damon: bool) -> Capabilities:
        return Capabilities(
            [
                Capability("idle_page_stats", kidled, "", ""),
                Capability("damon_cold_pages", damon, "", ""),
            ],
            CgroupVersion.V1,
        )

    def chosen(c: Capabilities | None) -> str:
        return choose_source(fake_host.host, c, str(tmp_path), ATTRS).name

    assert chosen(caps(kidled=True, damon=True)) == KidledColdPageSource.name
    assert chosen(caps(kidled=False, damon=True)) == DamonColdPageSource.name
    assert chosen(caps(kidled=False, damon=False)) == KidledColdPageSource.name
    assert chosen(None) == KidledColdPageSource.name


def test_tally_counts_pages_per_inode_in_zero_uniform_and_mixed_runs(tmp_path: Path) -> None:
    proc = str(tmp_path)
    charge(proc, 0, RAM_END, 0)
    charge(proc, 4 * MiB, 4 * MiB, 7)  # two uniform 2 MiB runs
    charge(proc, 10 * MiB + 3 * PAGE_SIZE, 5 * PAGE_SIZE, 9)  # mixed with free frames
    charge(proc, 10 * MiB + 8 * PAGE_SIZE, 2 * PAGE_SIZE, 7)

    got = tally(proc, [(0, 64 * MiB), (RAM_END - MiB, RAM_END + 8 * MiB)])  # past the end: cut

    assert got == {7: 4 * MiB // PAGE_SIZE + 2, 9: 5}
    assert tally(proc, [(4 * MiB, 6 * MiB)]) == {7: 2 * MiB // PAGE_SIZE}
