"""Pod and container collectors on a fake host of every layout: usage, throttling, page cache."""

from __future__ import annotations

import shutil
from collections import Counter
from collections.abc import Sequence

import pytest

from apis.extension import KubeQOS
from koordlet.collectors.framework import Collector, CollectResult
from koordlet.collectors.pagecache import PageCacheCollector
from koordlet.collectors.podresource import PodResourceCollector
from koordlet.collectors.podthrottled import PodThrottledCollector
from koordlet.collectors.runner import TickState
from koordlet.collectors.shared import cgroup_targets
from koordlet.errors import ParseError
from koordlet.metriccache import MetricCache
from koordlet.metriccache import series as s
from koordlet.statesinformer.kubepods import KubepodsSource
from koordlet.statesinformer.model import WorkloadSnapshot
from koordlet.system.cgroups import CgroupVersion
from koordlet.system.cgroupstats import read_file_bytes
from koordlet.system.stats import MEMORY_LRU
from tests.fakehost import FakeHost, container_id

UID = "6f0c8d2e-1b3a-4c5d-8e9f-0a1b2c3d4e5f"
OTHER = "0a9b8c7d-6e5f-4a3b-9c2d-1e0f9a8b7c6d"
CID = container_id("app")
CID2 = container_id("sidecar")
MiB = 1 << 20


def snapshot(fake: FakeHost) -> WorkloadSnapshot:
    return WorkloadSnapshot(pods=KubepodsSource(fake.host).list_pods(), generation=1)


def collect(
    collector: Collector, now: float, snap: WorkloadSnapshot
) -> dict[tuple[str, str], float]:
    result = collector.collect(TickState(now, snap))
    return {(sample.key.metric, sample.key.entity): sample.value for sample in result.all_samples()}


def run_all(
    collectors: Sequence[Collector],
    now: float,
    snap: WorkloadSnapshot,
    tick: TickState | None = None,
) -> list[CollectResult]:
    tick = tick or TickState(now, snap)
    return [c.collect(tick) for c in collectors]


@pytest.fixture
def pod(fake_host: FakeHost) -> tuple[str, list[str]]:
    return fake_host.add_pod(UID, KubeQOS.BURSTABLE, [("containerd", CID), ("containerd", CID2)])


POD = s.pod_entity(UID)
CONTAINER = s.container_entity(UID, CID)


def test_cpu_usage_is_the_counter_delta_over_the_tick_delta_in_cores(
    fake_host: FakeHost, pod: tuple[str, list[str]]
) -> None:
    pod_rel, (c1, _) = pod
    collector = PodResourceCollector(fake_host.host)
    fake_host.set_cpu_usage(pod_rel, 1_000_000_000)
    fake_host.set_cpu_usage(c1, 400_000_000)
    snap = snapshot(fake_host)
    collect(collector, 100.0, snap)

    fake_host.set_cpu_usage(pod_rel, 3_000_000_000)  # +2e9 ns over 2 s
    fake_host.set_cpu_usage(c1, 1_400_000_000)  # +1e9 ns over 2 s
    got = collect(collector, 102.0, snap)

    assert got[(s.POD_CPU_USAGE, POD)] == pytest.approx(1.0)
    assert got[(s.CONTAINER_CPU_USAGE, CONTAINER)] == pytest.approx(0.5)
    assert got[(s.CONTAINER_CPU_USAGE, s.container_entity(UID, CID2))] == 0.0


def test_first_cpu_reading_only_seeds_while_memory_is_reported_at_once(
    fake_host: FakeHost, pod: tuple[str, list[str]]
) -> None:
    pod_rel, _ = pod
    fake_host.set_cpu_usage(pod_rel, 5_000_000_000)
    fake_host.set_memory(pod_rel, anon=64 * MiB)

    got = collect(PodResourceCollector(fake_host.host), 100.0, snapshot(fake_host))

    assert (s.POD_CPU_USAGE, POD) not in got
    assert (s.CONTAINER_CPU_USAGE, CONTAINER) not in got
    assert got[(s.POD_MEMORY_USAGE, POD)] == 64 * MiB


def test_counter_that_went_backwards_reseeds(
    fake_host: FakeHost, pod: tuple[str, list[str]]
) -> None:
    pod_rel, _ = pod
    collector = PodResourceCollector(fake_host.host)
    snap = snapshot(fake_host)
    fake_host.set_cpu_usage(pod_rel, 9_000_000_000)
    collect(collector, 100.0, snap)
    fake_host.set_cpu_usage(pod_rel, 1_000_000_000)  # recreated under the same name

    assert (s.POD_CPU_USAGE, POD) not in collect(collector, 101.0, snap)

    fake_host.set_cpu_usage(pod_rel, 1_500_000_000)
    assert collect(collector, 102.0, snap)[(s.POD_CPU_USAGE, POD)] == pytest.approx(0.5)


def test_memory_usage_excludes_page_cache_and_page_cache_collector_includes_it(
    fake_host: FakeHost, pod: tuple[str, list[str]]
) -> None:
    pod_rel, (c1, _) = pod
    fake_host.set_memory(pod_rel, anon=100 * MiB, file=300 * MiB, unevictable=20 * MiB)
    fake_host.set_memory(c1, anon=30 * MiB, active_file=5 * MiB, inactive_file=7 * MiB)
    snap = snapshot(fake_host)

    usage = collect(PodResourceCollector(fake_host.host), 100.0, snap)
    with_cache = collect(PageCacheCollector(fake_host.host), 100.0, snap)

    assert usage[(s.POD_MEMORY_USAGE, POD)] == 120 * MiB
    assert usage[(s.CONTAINER_MEMORY_USAGE, CONTAINER)] == 30 * MiB
    assert with_cache[(s.POD_MEMORY_WITH_PAGE_CACHE, POD)] == 420 * MiB
    assert with_cache[(s.CONTAINER_MEMORY_WITH_PAGE_CACHE, CONTAINER)] == 42 * MiB


def test_cgroup_vanished_before_the_tick_is_skipped_and_others_still_reported(
    fake_host: FakeHost, pod: tuple[str, list[str]]
) -> None:
    _, (c1, _) = pod
    snap = snapshot(fake_host)  # the inventory still lists the container
    fake_host.remove_cgroup(c1)
    collectors: list[Collector] = [
        PodResourceCollector(fake_host.host),
        PodThrottledCollector(fake_host.host),
        PageCacheCollector(fake_host.host),
    ]

    results = run_all(collectors, 100.0, snap)

    entities = {sample.key.entity for r in results for sample in r.all_samples()}
    assert CONTAINER not in entities
    assert {POD, s.container_entity(UID, CID2)} <= entities


def test_cgroup_vanishing_between_two_of_its_files_is_skipped(
    fake_host: FakeHost, pod: tuple[str, list[str]]
) -> None:
    _, (c1, _) = pod
    if fake_host.version is CgroupVersion.V2:
        pytest.skip("v2 keeps every file of a cgroup in one directory")
    snap = snapshot(fake_host)
    # The CPU file is still there, memory.stat is gone: the pod is mid-deletion.
    shutil.rmtree(fake_host.layout.abs_dir("memory", c1))

    got = collect(PodResourceCollector(fake_host.host), 100.0, snap)

    assert (s.CONTAINER_MEMORY_USAGE, CONTAINER) not in got
    assert (s.POD_MEMORY_USAGE, POD) in got


def test_a_pod_that_left_and_came_back_reseeds_instead_of_bridging_the_gap(
    fake_host: FakeHost, pod: tuple[str, list[str]]
) -> None:
    pod_rel, _ = pod
    collector = PodResourceCollector(fake_host.host)
    fake_host.set_cpu_usage(pod_rel, 1_000_000_000)
    collect(collector, 100.0, snapshot(fake_host))
    collect(collector, 101.0, WorkloadSnapshot(generation=2))  # the pod left the inventory

    fake_host.set_cpu_usage(pod_rel, 50_000_000_000)
    got = collect(collector, 102.0, snapshot(fake_host))

    assert (s.POD_CPU_USAGE, POD) not in got


def test_throttled_ratio_is_throttled_periods_over_elapsed_periods(
    fake_host: FakeHost, pod: tuple[str, list[str]]
) -> None:
    pod_rel, (c1, _) = pod
    collector = PodThrottledCollector(fake_host.host)
    snap = snapshot(fake_host)
    fake_host.set_throttle(pod_rel, periods=100, throttled=10)
    fake_host.set_throttle(c1, periods=100, throttled=10)
    assert collect(collector, 100.0, snap) == {}  # first reading seeds

    fake_host.set_throttle(pod_rel, periods=300, throttled=60)
    got = collect(collector, 101.0, snap)

    assert got[(s.POD_CPU_THROTTLED_RATIO, POD)] == pytest.approx(0.25)
    assert got[(s.CONTAINER_CPU_THROTTLED_RATIO, CONTAINER)] == 0.0  # no period elapsed


def test_throttle_counters_that_reset_reseed(
    fake_host: FakeHost, pod: tuple[str, list[str]]
) -> None:
    pod_rel, _ = pod
    collector = PodThrottledCollector(fake_host.host)
    snap = snapshot(fake_host)
    fake_host.set_throttle(pod_rel, periods=1000, throttled=500)
    collect(collector, 100.0, snap)
    fake_host.set_throttle(pod_rel, periods=10, throttled=1)
    assert (s.POD_CPU_THROTTLED_RATIO, POD) not in collect(collector, 101.0, snap)

    fake_host.set_throttle(pod_rel, periods=20, throttled=6)
    assert collect(collector, 102.0, snap)[(s.POD_CPU_THROTTLED_RATIO, POD)] == pytest.approx(0.5)


def test_usage_and_page_cache_collectors_share_one_read_of_each_file_per_tick(
    fake_host: FakeHost, pod: tuple[str, list[str]]
) -> None:
    fake_host.add_pod(OTHER, KubeQOS.BESTEFFORT, [("cri-o", container_id("x"))])
    reads: Counter[str] = Counter()

    def counting(path: str) -> bytes:
        reads[path] += 1
        return read_file_bytes(path)

    snap = snapshot(fake_host)
    tick = TickState(100.0, snap, read=counting)
    run_all(
        [
            PodResourceCollector(fake_host.host),
            PodThrottledCollector(fake_host.host),
            PageCacheCollector(fake_host.host),
        ],
        100.0,
        snap,
        tick,
    )

    cgroups = 2 + 3  # two pods, three containers
    files_per_cgroup = 2 if fake_host.version is CgroupVersion.V2 else 3
    assert len(reads) == cgroups * files_per_cgroup
    assert set(reads.values()) == {1}


def test_the_collectors_and_the_metric_cache_share_one_copy_of_each_entity_id(
    fake_host: FakeHost, pod: tuple[str, list[str]]
) -> None:
    """At 1,000 pods each copy of the entity ids and targets is about 1 MiB (docs/benchmarks.md,
    resident memory): the collectors share one tuple of targets per snapshot, and the series
    the cache creates hold the very strings (and keys) of the samples."""
    snap = snapshot(fake_host)
    cache = MetricCache()
    results = run_all(
        [PodResourceCollector(fake_host.host), PageCacheCollector(fake_host.host)], 100.0, snap
    )
    for result in results:
        cache.append(100.0, result.samples)
        cache.append_columns(100.0, result.columns)
    assert cgroup_targets(snap) is cgroup_targets(snap)
    entities = {t.entity: t.entity for t in cgroup_targets(snap)}
    assert set(cache.entities()) == set(entities)
    for entity in cache.entities():
        assert entity is entities[entity]
    for sample in results[0].all_samples():
        assert sample.key.entity is entities[sample.key.entity]


def test_the_usage_and_page_cache_collectors_hold_one_copy_of_each_memory_path(
    fake_host: FakeHost, pod: tuple[str, list[str]]
) -> None:
    """800 memory file paths at 200 pods, 0.17 MiB a copy (:func:`target_paths`); the paths of
    a later snapshot are built anew."""
    snap = snapshot(fake_host)
    usage, page_cache = PodResourceCollector(fake_host.host), PageCacheCollector(fake_host.host)
    run_all([usage, page_cache], 100.0, snap)
    memory_paths = usage._plan.mem_paths
    assert len(memory_paths) == 3  # the pod and its two containers
    assert all(a is b for a, b in zip(memory_paths, page_cache._plan.paths, strict=True))
    assert memory_paths[0] == MEMORY_LRU.bind(fake_host.host.layout).path(pod[0])

    fake_host.add_pod(OTHER, KubeQOS.BESTEFFORT, [("cri-o", container_id("x"))])
    later = WorkloadSnapshot(pods=KubepodsSource(fake_host.host).list_pods(), generation=2)
    run_all([usage, page_cache], 101.0, later)
    assert len(usage._plan.mem_paths) == len(page_cache._plan.paths) == 5
    pairs = zip(usage._plan.mem_paths, page_cache._plan.paths, strict=True)
    assert all(a is b for a, b in pairs)


def test_a_malformed_memory_file_raises_a_parse_error_naming_the_file(
    fake_host: FakeHost, pod: tuple[str, list[str]]
) -> None:
    pod_rel, _ = pod
    # v1: the hierarchical LRU lines of memory.numa_stat (the stat table's memory_lru)
    v1 = fake_host.host.layout.version is CgroupVersion.V1
    name = "memory.numa_stat" if v1 else "memory.stat"
    fake_host.write("memory", pod_rel, name, "garbage\n")

    with pytest.raises(ParseError, match=name.replace(".", r"\.")):
        collect(PodResourceCollector(fake_host.host), 100.0, snapshot(fake_host))


def test_a_malformed_cpu_counter_raises_a_parse_error_naming_the_file(
    fake_host: FakeHost, pod: tuple[str, list[str]]
) -> None:
    pod_rel, _ = pod
    if fake_host.host.layout.version is CgroupVersion.V2:
        fake_host.write("cpu", pod_rel, "cpu.stat", "usage_usec oops\n")
        name = r"cpu\.stat"
    else:
        fake_host.write("cpuacct", pod_rel, "cpuacct.usage", "oops\n")
        name = r"cpuacct\.usage"

    with pytest.raises(ParseError, match=name):
        collect(PodResourceCollector(fake_host.host), 100.0, snapshot(fake_host))


def test_a_malformed_throttling_counter_raises_a_parse_error_naming_the_file(
    fake_host: FakeHost, pod: tuple[str, list[str]]
) -> None:
    pod_rel, _ = pod
    collector = PodThrottledCollector(fake_host.host)
    collect(collector, 100.0, snapshot(fake_host))  # a good tick first: the layout is learned
    stat = read_file_bytes(fake_host.host.layout.file("cpu", pod_rel, "cpu.stat"))
    fake_host.write(
        "cpu", pod_rel, "cpu.stat", stat.replace(b"nr_throttled ", b"nr_throttled x").decode()
    )

    with pytest.raises(ParseError, match=r"cpu\.stat"):
        collect(collector, 101.0, snapshot(fake_host))
