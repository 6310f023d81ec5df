"""The per-cgroup collectors' column path (every file of a column read and parsed at once) gives
exactly what their file-by-file path gives, tick after tick, on every layout; it is the path of
the steady state, and every other tick falls back to the file-by-file one.

The fake host's files are on tmpfs, which ``OpenFiles`` never keeps open, so the ticks here read
columns through :class:`FreshColumns`: each column is read afresh, whole, as the kept files of a
real cgroup tree are (``tests/integration`` drives the real ``OpenFiles`` on real cgroups).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest

from apis.extension import KubeQOS
from koordlet.collectors.beresource import BEResourceCollector
from koordlet.collectors.framework import Collector
from koordlet.collectors.pagecache import PageCacheCollector
from koordlet.collectors.podresource import PodResourceCollector
from koordlet.collectors.podthrottled import PodThrottledCollector
from koordlet.collectors.runner import TickState
from koordlet.errors import HostError, ParseError
from koordlet.metriccache import series as s
from koordlet.statesinformer.kubepods import KubepodsSource
from koordlet.statesinformer.model import WorkloadSnapshot
from koordlet.system.cgroups import CgroupVersion
from koordlet.system.cgroupstats import read_file_bytes
from koordlet.system.openfiles import OpenFiles
from koordlet.system.stats import CPU_THROTTLING, CPU_USAGE, MEMORY_LRU
from tests.fakehost import FakeHost, container_id

MiB = 1 << 20
UIDS = ("6f0c8d2e-1b3a-4c5d-8e9f-0a1b2c3d4e5f", "0a9b8c7d-6e5f-4a3b-9c2d-1e0f9a8b7c6d")


class FreshColumns(OpenFiles):
    """Keeps nothing open; a column is every file read afresh, or None when one fails."""

    def __init__(self) -> None:
        super().__init__(limit=0)
        self.columns = 0

    def column(self, paths: tuple[str, ...]) -> list[bytes] | None:
        try:
            data = [read_file_bytes(path) for path in paths]
        except HostError:
            return None
        self.columns += 1
        return data


Samples = dict[tuple[str, str], float]


def build(fake: FakeHost) -> list[Collector]:
    return [
        PodResourceCollector(fake.host),
        PodThrottledCollector(fake.host),
        PageCacheCollector(fake.host),
    ]


def tick_all(
    collectors: Sequence[Collector], now: float, snap: WorkloadSnapshot, *, columns: bool
) -> tuple[list[Samples], TickState]:
    """One tick of the three collectors, in the table's order; the samples of each."""
    tick = TickState(now, snap, open_files=FreshColumns() if columns else None)
    out = []
    for collector in collectors:
        samples = collector.collect(tick).all_samples()
        got = {(sample.key.metric, sample.key.entity): sample.value for sample in samples}
        assert len(got) == len(samples)  # no series twice
        out.append(got)
    return out, tick


def spy(monkeypatch: pytest.MonkeyPatch, cls: type[Any], calls: list[str]) -> None:
    """Count the file-by-file path's runs of ``cls``."""
    each: Callable[..., Any] = cls._collect_each

    def counted(self: Any, tick: Any) -> Any:
        calls.append(cls.__name__)
        return each(self, tick)

    monkeypatch.setattr(cls, "_collect_each", counted)


def test_the_column_path_gives_the_file_by_file_samples_tick_after_tick(
    fake_host: FakeHost, monkeypatch: pytest.MonkeyPatch
) -> None:
    rels = []
    for n, uid in enumerate(UIDS):
        pod_rel, containers = fake_host.add_pod(
            uid,
            KubeQOS.BURSTABLE,
            [("containerd", container_id(f"{uid}-{c}")) for c in range(2 + n)],
        )
        rels += [pod_rel, *containers]
    snap = WorkloadSnapshot(pods=KubepodsSource(fake_host.host).list_pods(), generation=1)
    calls: list[str] = []
    for cls in (PodResourceCollector, PodThrottledCollector):
        spy(monkeypatch, cls, calls)
    by_columns, by_files = build(fake_host), build(fake_host)

    def state(step: int) -> None:
        for i, rel in enumerate(rels):
            fake_host.set_cpu_usage(rel, (step + 1) * (i + 1) * 123_456_789)
            fake_host.set_throttle(rel, periods=step * 10 * i, throttled=step * i)
            fake_host.set_memory(rel, anon=(i + step) * MiB, file=3 * i * MiB, unevictable=i * 4096)

    for step, now in enumerate((100.0, 101.0, 102.5, 103.0)):
        state(step)
        calls.clear()
        columns, tick = tick_all(by_columns, now, snap, columns=True)
        column_calls = list(calls)
        files, _ = tick_all(by_files, now, snap, columns=False)

        assert columns == files, f"tick {step}"
        if step == 0:  # seeding: file by file (the files it read stay in the tick's memo)
            assert column_calls == ["PodResourceCollector", "PodThrottledCollector"]
        else:
            assert column_calls == []
            assert all(columns), f"tick {step}: a collector gave nothing"
            # Each file once (the memo holds the columns): v1 cpuacct.usage, cpu.stat and
            # memory.numa_stat; v2 cpu.stat (usage and throttling) and memory.stat.
            per_cgroup = 3 if fake_host.version is CgroupVersion.V1 else 2
            assert tick.reads == per_cgroup * len(rels)
    assert len(columns[0]) == 2 * len(rels)
    assert len(columns[1]) == len(rels)


def test_a_counter_reset_or_a_vanished_cgroup_takes_the_file_by_file_path_for_that_tick(
    fake_host: FakeHost, monkeypatch: pytest.MonkeyPatch
) -> None:
    pod_rel, (c1, c2) = fake_host.add_pod(
        UIDS[0],
        KubeQOS.BURSTABLE,
        [("containerd", container_id("a")), ("containerd", container_id("b"))],
    )
    snap = WorkloadSnapshot(pods=KubepodsSource(fake_host.host).list_pods(), generation=1)
    calls: list[str] = []
    for cls in (PodResourceCollector, PodThrottledCollector):
        spy(monkeypatch, cls, calls)
    by_columns, by_files = build(fake_host), build(fake_host)
    for rel in (pod_rel, c1, c2):
        fake_host.set_cpu_usage(rel, 5_000_000_000)
        fake_host.set_throttle(rel, periods=50, throttled=5)
    for now in (100.0, 101.0):
        tick_all(by_columns, now, snap, columns=True)
        tick_all(by_files, now, snap, columns=False)

    fake_host.set_cpu_usage(c1, 1_000)  # recreated: the counter went back
    fake_host.set_throttle(c2, periods=10, throttled=1)
    calls.clear()
    columns, _ = tick_all(by_columns, 102.0, snap, columns=True)
    assert calls == ["PodResourceCollector", "PodThrottledCollector"]
    files, _ = tick_all(by_files, 102.0, snap, columns=False)
    assert columns == files

    fake_host.remove_cgroup(c2)  # the inventory still lists it
    calls.clear()
    columns, _ = tick_all(by_columns, 103.0, snap, columns=True)
    assert calls == ["PodResourceCollector", "PodThrottledCollector"]
    files, _ = tick_all(by_files, 103.0, snap, columns=False)
    assert columns == files
    assert not any(entity.endswith(container_id("b")) for _, entity in columns[0])


def test_a_malformed_file_in_a_column_raises_the_file_by_file_parse_error(
    fake_host: FakeHost,
) -> None:
    _, (c1,) = fake_host.add_pod(UIDS[0], KubeQOS.BURSTABLE, [("containerd", container_id("a"))])
    snap = WorkloadSnapshot(pods=KubepodsSource(fake_host.host).list_pods(), generation=1)
    collector = PodResourceCollector(fake_host.host)
    tick_all([collector], 100.0, snap, columns=True)
    controller, name = (
        ("cpuacct", "cpuacct.usage")
        if fake_host.version.value == "v1"
        else (
            "cpu",
            "cpu.stat",
        )
    )
    fake_host.write(controller, c1, name, "garbage\n")

    with pytest.raises(ParseError, match=name):
        tick_all([collector], 101.0, snap, columns=True)


def test_bound_stats_read_a_column_once_and_share_its_parse_through_the_memo(
    fake_host: FakeHost,
) -> None:
    pod_rel, containers = fake_host.add_pod(
        UIDS[0], KubeQOS.BURSTABLE, [("containerd", container_id("a"))]
    )
    fake_host.set_memory(pod_rel, anon=7 * MiB, file=2 * MiB)
    snap = WorkloadSnapshot(pods=KubepodsSource(fake_host.host).list_pods(), generation=1)
    layout = fake_host.host.layout
    memory, cpu, throttling = (
        MEMORY_LRU.bind(layout),
        CPU_USAGE.bind(layout),
        CPU_THROTTLING.bind(layout),
    )
    paths = tuple(memory.path(rel) for rel in (pod_rel, *containers))
    open_files = FreshColumns()
    tick = TickState(100.0, snap, open_files=open_files)

    first = memory.column(tick, paths)
    second = memory.column(tick, paths)  # shared: from the memo, not read again

    assert first is not None
    assert first == second
    assert first == [memory.get(TickState(100.0, snap), p) for p in paths]
    assert first[0].anon + first[0].unevictable == 7 * MiB
    assert open_files.columns == 1
    cpu_paths = tuple(cpu.path(rel) for rel in (pod_rel, *containers))
    assert cpu.column(tick, cpu_paths) == [cpu.get(TickState(100.0, snap), p) for p in cpu_paths]
    thr_paths = tuple(throttling.path(rel) for rel in (pod_rel, *containers))
    assert throttling.column(tick, thr_paths) == [
        throttling.get(TickState(100.0, snap), p) for p in thr_paths
    ]
    # No kept files (a reader without OpenFiles): None, and nothing was read.
    plain = TickState(100.0, snap)
    assert memory.column(plain, paths) is None
    assert plain.reads == 0


def test_a_column_partly_read_earlier_in_the_tick_is_read_file_by_file(
    fake_host: FakeHost,
) -> None:
    pod_rel, containers = fake_host.add_pod(
        UIDS[0], KubeQOS.BURSTABLE, [("containerd", container_id("a"))]
    )
    snap = WorkloadSnapshot(pods=KubepodsSource(fake_host.host).list_pods(), generation=1)
    cpu = CPU_USAGE.bind(fake_host.host.layout)
    paths = tuple(cpu.path(rel) for rel in (pod_rel, *containers))
    tick = TickState(100.0, snap, open_files=FreshColumns())
    tick.read(paths[1])

    assert tick.column(paths) is None  # each file is read at most once a tick
    assert tick.reads == 1


@pytest.mark.parametrize(
    ("cpusets", "expected"),
    [
        (("0-3", "1", "", "2-3"), 1.0),  # the smallest container's; an empty one ignored
        (("0-3", "", ""), 4.0),  # only empty container cpusets: the QoS cgroup's
        (("", "0-1", "0-2"), 2.0),  # an empty QoS cpuset ignored too
    ],
)
def test_the_be_collector_takes_its_container_cpusets_as_one_column(
    fake_host: FakeHost, cpusets: tuple[str, ...], expected: float
) -> None:
    v2 = fake_host.version is CgroupVersion.V2
    name = "cpuset.cpus.effective" if v2 else "cpuset.cpus"
    be = fake_host.layout.qos_dir(KubeQOS.BESTEFFORT)
    _, containers = fake_host.add_pod(
        UIDS[0],
        KubeQOS.BESTEFFORT,
        [("containerd", container_id(f"be-{n}")) for n in range(len(cpusets) - 1)],
    )
    fake_host.write("cpuset", be, name, cpusets[0])
    for rel, cpus in zip(containers, cpusets[1:], strict=True):
        fake_host.write("cpuset", rel, name, cpus)
    snap = WorkloadSnapshot(pods=KubepodsSource(fake_host.host).list_pods(), generation=1)
    open_files = FreshColumns()

    by_columns = BEResourceCollector(fake_host.host).collect(
        TickState(100.0, snap, open_files=open_files)
    )
    by_files = BEResourceCollector(fake_host.host).collect(TickState(100.0, snap))

    assert open_files.columns == 1
    assert sorted(by_columns.samples) == sorted(by_files.samples)
    assert dict(by_columns.samples)[(s.BE_CPU_REAL_LIMIT, s.BE)] == expected
