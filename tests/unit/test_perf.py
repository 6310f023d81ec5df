"""The perf_event binding and the CPI collector, through a fake opener.

The hardware path (a cycles leader with an instructions member per CPU, multiplex scaling, a
failure on one CPU) cannot run on this machine, which has no PMU: :class:`FakePerf` stands in
for the system calls only. It hands out fake descriptors, checks the attrs and the group wiring
as the kernel would, and answers reads with buffers in the kernel's real group layout. Cgroup
directories are real folders of a fake host tree, opened for real.
"""

from __future__ import annotations

import ctypes
import dataclasses
import errno
import logging
import os
import platform
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from apis.extension import KubeQOS
from koordlet.collectors import cpi
from koordlet.collectors.framework import CollectorContext, CollectResult
from koordlet.collectors.runner import CollectorRunner, TickState
from koordlet.collectors.table import COLLECTORS, build_collectors, export_max_ages
from koordlet.config import KoordletConfig
from koordlet.errors import CgroupGoneError, ConfigError, HostError, ParseError
from koordlet.features import parse_feature_gates
from koordlet.metriccache import MetricCache
from koordlet.metriccache import series as s
from koordlet.statesinformer.kubepods import KubepodsSource
from koordlet.statesinformer.model import WorkloadSnapshot
from koordlet.system import oserrors, perf
from koordlet.system.cgroups import CgroupDriver, CgroupVersion
from tests.fakehost import FakeHost, container_id

UID = "6f0c8d2e-1b3a-4c5d-8e9f-0a1b2c3d4e5f"
APP, SIDECAR = container_id("app"), container_id("sidecar")
APP_ENTITY, SIDECAR_ENTITY = s.container_entity(UID, APP), s.container_entity(UID, SIDECAR)
CPUS = (0, 1, 2, 3)
_NAMES = {
    (perf.PERF_TYPE_HARDWARE, perf.PERF_COUNT_HW_CPU_CYCLES): "cycles",
    (perf.PERF_TYPE_HARDWARE, perf.PERF_COUNT_HW_INSTRUCTIONS): "instructions",
    (perf.PERF_TYPE_SOFTWARE, perf.PERF_COUNT_SW_TASK_CLOCK): "task-clock",
}


@dataclass
class Counts:
    """What a group on one CPU reads once enabled."""

    enabled: int
    running: int
    values: dict[str, int]


@dataclass
class _Event:
    name: str
    cpu: int
    target: str
    leader: int
    event_id: int
    enabled: bool = False


@dataclass
class FakePerf:
    """A :class:`~koordlet.system.perf.PerfOpener` over fake descriptors (module docstring)."""

    counts: dict[tuple[str, int], Counts] = field(default_factory=dict)
    """(cgroup directory, cpu) → what its group reads; absent: the cgroup never ran there."""
    fail_open: dict[tuple[str, int | None], int] = field(default_factory=dict)
    """(event name, cpu or None for every cpu) → errno of perf_event_open."""
    fail_read: dict[tuple[str, int], int] = field(default_factory=dict)
    """(cgroup directory, cpu) → errno of read."""
    events: dict[int, _Event] = field(default_factory=dict)
    """Open descriptors."""
    opened: int = 0
    probes: int = 0
    _next: int = 5000

    def open(self, attr: perf.PerfEventAttr, pid: int, cpu: int, group_fd: int, flags: int) -> int:
        name = _NAMES[(attr.type, attr.config)]
        if attr.size != ctypes.sizeof(perf.PerfEventAttr) or (
            attr.read_format != perf.GROUP_READ_FORMAT
        ):
            raise OSError(errno.EINVAL, "bad attr")
        leader = group_fd if group_fd != -1 else 0
        is_leader = group_fd == -1
        if bool(attr.flags & perf.ATTR_FLAG_DISABLED) != is_leader:
            raise OSError(errno.EINVAL, "only the leader starts disabled in these tests")
        if not is_leader and (group_fd not in self.events or self.events[group_fd].cpu != cpu):
            raise OSError(errno.EINVAL, "group_fd is not a leader on this cpu")
        if flags & perf.PERF_FLAG_PID_CGROUP:
            target = os.readlink(f"/proc/self/fd/{pid}")
        else:
            target = "all tasks" if pid == -1 else f"pid {pid}"
            self.probes += is_leader
        code = self.fail_open.get((name, cpu), self.fail_open.get((name, None)))
        if code is not None:
            raise OSError(code, os.strerror(code))
        fd = self._next
        self._next += 1
        self.events[fd] = _Event(name, cpu, target, leader or fd, event_id=fd * 10 + 7)
        self.opened += 1
        return fd

    def ioctl(self, fd: int, request: int, arg: int) -> None:
        assert arg == perf.PERF_IOC_FLAG_GROUP
        group = [e for e in self.events.values() if e.leader == fd]
        if request == perf.PERF_EVENT_IOC_ENABLE:
            for e in group:
                e.enabled = True

    def event_id(self, fd: int) -> int:
        return self.events[fd].event_id

    def read(self, fd: int, size: int) -> bytes:
        leader = self.events[fd]
        code = self.fail_read.get((leader.target, leader.cpu))
        if code is not None:
            raise OSError(code, os.strerror(code))
        group = [e for e in self.events.values() if e.leader == fd]
        counts = self.counts.get((leader.target, leader.cpu)) if leader.enabled else None
        counts = counts or Counts(0, 0, {})
        pairs = [(counts.values.get(e.name, 0), e.event_id) for e in group]
        data = perf.pack_group_read(counts.enabled, counts.running, pairs)
        return data[:size]

    def close(self, fd: int) -> None:
        del self.events[fd]


# The binding -----------------------------------------------------------------------------------


def test_the_attr_has_the_kernel_abi_layout_of_perf_attr_size_ver5() -> None:
    attr = perf.PerfEventAttr
    offsets = {name: getattr(attr, name).offset for name, _ in attr._fields_}

    assert ctypes.sizeof(attr) == perf.PERF_ATTR_SIZE_VER5 == 112
    assert offsets["config"] == 8
    assert offsets["read_format"] == 32
    assert offsets["flags"] == 40
    assert offsets["config1"] == 56
    assert offsets["sample_regs_intr"] == 96
    assert offsets["sample_max_stack"] == 108


@pytest.mark.skipif(
    platform.machine() not in ("x86_64", "aarch64"), reason="asm-generic ioctl encoding"
)
def test_ioctl_numbers_and_the_syscall_number_are_the_kernel_s() -> None:
    assert perf.PERF_EVENT_IOC_ENABLE == 0x2400
    assert perf.PERF_EVENT_IOC_DISABLE == 0x2401
    assert perf.PERF_EVENT_IOC_RESET == 0x2403
    assert perf.PERF_EVENT_IOC_ID == 0x80082407
    assert perf.SYS_PERF_EVENT_OPEN["x86_64"] == 298
    assert perf.SYS_PERF_EVENT_OPEN["aarch64"] == 241


def test_only_the_leader_starts_disabled_and_every_event_reads_as_a_group() -> None:
    leader = perf.event_attr(perf.CYCLES, disabled=True)
    member = perf.event_attr(perf.INSTRUCTIONS, disabled=False)

    assert (leader.type, leader.config) == (perf.PERF_TYPE_HARDWARE, 0)
    assert (member.type, member.config) == (perf.PERF_TYPE_HARDWARE, 1)
    assert leader.flags & perf.ATTR_FLAG_DISABLED
    assert not member.flags & perf.ATTR_FLAG_DISABLED
    assert leader.read_format == member.read_format == 0b1111
    assert leader.size == 112


def test_an_unknown_machine_has_no_system_call_number_and_says_so() -> None:
    with pytest.raises(HostError, match="no system call number known for machine 'vax'"):
        perf.SyscallOpener("vax")


@given(
    enabled=st.integers(0, 2**64 - 1),
    running=st.integers(0, 2**64 - 1),
    values=st.lists(st.integers(0, 2**64 - 1), min_size=1, max_size=4),
)
def test_a_group_read_round_trips_through_the_kernel_layout(
    enabled: int, running: int, values: list[int]
) -> None:
    ids = {100 + i: f"e{i}" for i in range(len(values))}
    data = perf.pack_group_read(enabled, running, [(v, 100 + i) for i, v in enumerate(values)])

    reading = perf.parse_group_read(data, ids, "g")

    assert len(data) == perf.group_read_size(len(values)) == 24 + 16 * len(values)
    assert (reading.time_enabled, reading.time_running) == (enabled, running)
    assert reading.values == {f"e{i}": v for i, v in enumerate(values)}


def test_values_are_matched_to_events_by_id_not_by_position() -> None:
    data = perf.pack_group_read(10, 10, [(5, 22), (7, 11)])

    reading = perf.parse_group_read(data, {11: "cycles", 22: "instructions"}, "g")

    assert reading.values == {"cycles": 7, "instructions": 5}


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"\x01" * 10, "shorter than its header"),
        (perf.pack_group_read(1, 1, [(1, 11)]), "says 1 events in 40 bytes; the group has 2"),
        (perf.pack_group_read(1, 1, [(1, 11), (2, 33)]), "unknown or repeated event id 33"),
        (perf.pack_group_read(1, 1, [(1, 11), (2, 11)]), "unknown or repeated event id 11"),
    ],
)
def test_a_malformed_group_read_is_a_parse_error_naming_the_group(
    data: bytes, message: str
) -> None:
    with pytest.raises(ParseError, match=f"cpu 3 of x: .*{message}"):
        perf.parse_group_read(data, {11: "cycles", 22: "instructions"}, "cpu 3 of x")


def test_multiplexed_counts_are_extrapolated_and_a_group_that_never_ran_has_no_estimate() -> None:
    full = perf.GroupReading(100, 100, {"cycles": 30})
    half = perf.GroupReading(100, 25, {"cycles": 30})
    starved = perf.GroupReading(100, 0, {"cycles": 0})
    idle = perf.GroupReading(0, 0, {"cycles": 0})

    assert full.scaled() == {"cycles": 30.0}
    assert half.scaled() == {"cycles": 120.0}
    assert starved.scaled() is None
    assert idle.scaled() == {"cycles": 0.0}


def test_a_member_that_fails_to_open_closes_the_leader_and_names_event_cpu_and_errno() -> None:
    fake = FakePerf(fail_open={("instructions", 2): errno.EMFILE})

    with pytest.raises(HostError, match=r"perf_event_open\(instructions\) on cpu 2.*EMFILE") as e:
        perf.open_group(fake, (perf.CYCLES, perf.INSTRUCTIONS), pid=-1, cpu=2)

    assert fake.events == {}
    assert fake.opened == 1
    assert oserrors.errno_of(e.value) == errno.EMFILE


def test_enoent_in_cgroup_mode_means_the_cgroup_is_gone(tmp_path: Path) -> None:
    fake = FakePerf(fail_open={("cycles", None): errno.ENOENT})

    with pytest.raises(CgroupGoneError):
        perf.CgroupCounters.open(fake, str(tmp_path), CPUS, (perf.CYCLES, perf.INSTRUCTIONS))
    with pytest.raises(CgroupGoneError, match="cgroup gone"):
        perf.CgroupCounters.open(fake, str(tmp_path / "gone"), CPUS, (perf.CYCLES,))


def test_a_failure_on_any_cpu_closes_every_group_opened_so_far(tmp_path: Path) -> None:
    fake = FakePerf(fail_open={("instructions", 3): errno.ENODEV})
    before = len(os.listdir("/proc/self/fd"))

    with pytest.raises(HostError, match=r"on cpu 3.*ENODEV"):
        perf.CgroupCounters.open(fake, str(tmp_path), CPUS, (perf.CYCLES, perf.INSTRUCTIONS))

    assert fake.opened == 7
    assert fake.events == {}
    assert len(os.listdir("/proc/self/fd")) == before  # the directory descriptor too


def test_cgroup_counters_sum_scaled_counts_over_cpus_and_close_everything(tmp_path: Path) -> None:
    d = str(tmp_path)
    fake = FakePerf(
        counts={
            (d, 0): Counts(10, 10, {"cycles": 1000, "instructions": 500}),
            (d, 1): Counts(10, 5, {"cycles": 100, "instructions": 100}),  # multiplexed: x2
        }
    )
    counters = perf.CgroupCounters.open(fake, d, CPUS, (perf.CYCLES, perf.INSTRUCTIONS))
    counters.start()

    totals = counters.read()
    counters.close()

    assert counters.fd_count == 0
    assert fake.events == {}
    assert totals is not None
    assert totals.values == {"cycles": 1200.0, "instructions": 700.0}
    assert (totals.time_enabled, totals.time_running) == (20, 15)


def test_a_cgroup_that_ran_nowhere_or_was_starved_on_one_cpu_has_no_totals(
    tmp_path: Path,
) -> None:
    d = str(tmp_path)
    events = (perf.CYCLES, perf.INSTRUCTIONS)
    idle = perf.CgroupCounters.open(FakePerf(), d, CPUS, events)
    starved_fake = FakePerf(
        counts={(d, 0): Counts(10, 10, {"cycles": 9}), (d, 2): Counts(10, 0, {})}
    )
    starved = perf.CgroupCounters.open(starved_fake, d, CPUS, events)
    for counters in (idle, starved):
        counters.start()

    assert idle.read() is None
    assert starved.read() is None


def test_a_read_failure_on_one_cpu_fails_the_whole_cgroup(tmp_path: Path) -> None:
    d = str(tmp_path)
    fake = FakePerf(
        counts={(d, cpu): Counts(5, 5, {"cycles": 1}) for cpu in CPUS},
        fail_read={(d, 1): errno.EIO},
    )
    counters = perf.CgroupCounters.open(fake, d, CPUS, (perf.CYCLES, perf.INSTRUCTIONS))
    counters.start()

    with pytest.raises(HostError, match=r"read perf group on cpu 1.*EIO"):
        counters.read()


@pytest.mark.parametrize(
    ("code", "name", "meaning"),
    [
        (errno.ENOENT, "ENOENT", "exposes no such hardware counter"),
        (errno.EOPNOTSUPP, "EOPNOTSUPP", "exposes no such hardware counter"),
        (errno.ENODEV, "ENODEV", "exposes no such hardware counter"),
        (errno.EACCES, "EACCES", "CAP_PERFMON"),
        (errno.ENOSYS, "ENOSYS", "CONFIG_PERF_EVENTS"),
    ],
)
def test_a_failed_probe_is_unsupported_with_the_errno_and_what_it_means(
    code: int, name: str, meaning: str
) -> None:
    fake = FakePerf(fail_open={("cycles", None): code})

    support = perf.probe_events((perf.CYCLES, perf.INSTRUCTIONS), fake, cpu=0)

    assert not support.supported
    assert support.errno == code
    assert f"{name} (" in support.reason
    assert meaning in support.reason
    assert fake.events == {}


def test_a_successful_probe_opens_the_group_cpu_wide_and_closes_it() -> None:
    fake = FakePerf()

    support = perf.probe_events((perf.CYCLES, perf.INSTRUCTIONS), fake, cpu=1)

    assert support.supported
    assert fake.opened == 2
    assert fake.events == {}


# The collector ---------------------------------------------------------------------------------


@pytest.fixture
def node(fake_host: FakeHost) -> tuple[FakeHost, WorkloadSnapshot, dict[str, str]]:
    """A pod with two containers; their perf_event cgroup folders exist (v1: made here, the
    fake tree has no perf_event hierarchy of its own)."""
    _, rels = fake_host.add_pod(
        UID, KubeQOS.BURSTABLE, [("containerd", APP), ("containerd", SIDECAR)]
    )
    dirs = {}
    for entity, rel in zip((APP_ENTITY, SIDECAR_ENTITY), rels, strict=True):
        path = fake_host.layout.abs_dir("perf_event", rel)
        os.makedirs(path, exist_ok=True)
        dirs[entity] = os.path.realpath(path)
    snap = WorkloadSnapshot(pods=KubepodsSource(fake_host.host).list_pods(), generation=1)
    return fake_host, snap, dirs


def run_counts(dirs: dict[str, str]) -> dict[tuple[str, int], Counts]:
    app, sidecar = dirs[APP_ENTITY], dirs[SIDECAR_ENTITY]
    return {
        (app, 0): Counts(10, 10, {"cycles": 3000, "instructions": 1000}),
        (app, 3): Counts(10, 5, {"cycles": 500, "instructions": 250}),
        (sidecar, 1): Counts(7, 7, {"cycles": 40, "instructions": 80}),
    }


def make(fake_host: FakeHost, fake: FakePerf, period: float = 60.0) -> cpi.CPICollector:
    return cpi.CPICollector(fake_host.host, period=period, opener=fake, cpus=lambda: CPUS)


def values(result: CollectResult) -> dict[tuple[str, str], float]:
    return {(smp.key.metric, smp.key.entity): smp.value for smp in result.samples}


def test_a_window_opens_counters_then_reports_scaled_sums_and_closes_every_descriptor(
    node: tuple[FakeHost, WorkloadSnapshot, dict[str, str]],
) -> None:
    fake_host, snap, dirs = node
    fake = FakePerf(counts=run_counts(dirs))
    collector = make(fake_host, fake)

    opening = collector.collect(TickState(1000.0, snap))
    held = collector.fd_count
    midway = collector.collect(TickState(1005.0, snap))
    done = collector.collect(TickState(1010.0, snap))

    assert not opening.samples
    assert not midway.samples
    assert held == 2 * 2 * len(CPUS)
    assert values(done) == {
        (s.CONTAINER_CPI_CYCLES, APP_ENTITY): 4000.0,
        (s.CONTAINER_CPI_INSTRUCTIONS, APP_ENTITY): 1500.0,
        (s.CONTAINER_CPI_CYCLES, SIDECAR_ENTITY): 40.0,
        (s.CONTAINER_CPI_INSTRUCTIONS, SIDECAR_ENTITY): 80.0,
    }
    assert collector.fd_count == 0
    assert fake.events == {}


def test_windows_start_once_a_period_as_koordinator_defaults_say(
    node: tuple[FakeHost, WorkloadSnapshot, dict[str, str]],
) -> None:
    fake_host, snap, dirs = node
    fake = FakePerf(counts=run_counts(dirs))
    collector = make(fake_host, fake)

    sampled_at = [t for t in range(180) if collector.collect(TickState(float(t), snap)).samples]

    assert (cpi.DEFAULT_PERIOD, cpi.DEFAULT_WINDOW) == (60.0, 10.0)
    assert sampled_at == [10, 70, 130]
    assert fake.opened == 3 * 2 * 2 * len(CPUS) + fake.probes * 2
    assert fake.probes == 1
    assert fake.events == {}


def test_a_failure_on_one_cpu_drops_only_that_container_and_warns_once(
    node: tuple[FakeHost, WorkloadSnapshot, dict[str, str]], caplog: pytest.LogCaptureFixture
) -> None:
    fake_host, snap, dirs = node
    fake = FakePerf(counts=run_counts(dirs), fail_read={(dirs[APP_ENTITY], 2): errno.EIO})
    collector = make(fake_host, fake, period=20.0)

    with caplog.at_level(logging.DEBUG, logger="koordlet.collectors.cpi"):
        results = [collector.collect(TickState(float(t), snap)) for t in (0, 10, 20, 30)]

    assert {e for _, e in values(results[1])} == {SIDECAR_ENTITY}
    assert values(results[3]) == values(results[1])
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "no sample for 1 containers" in warnings[0].getMessage()
    assert "EIO" in warnings[0].getMessage()
    assert fake.events == {}


def test_a_container_that_leaves_the_inventory_mid_window_is_closed_at_the_next_tick(
    node: tuple[FakeHost, WorkloadSnapshot, dict[str, str]],
) -> None:
    fake_host, snap, dirs = node
    fake = FakePerf(counts=run_counts(dirs))
    collector = make(fake_host, fake)
    collector.collect(TickState(0.0, snap))
    pod = snap.pods[UID]
    app_only = dataclasses.replace(pod, containers=tuple(c for c in pod.containers if c.id == APP))
    fewer = WorkloadSnapshot(pods={UID: app_only}, generation=2)

    collector.collect(TickState(1.0, fewer))
    remaining = {e.target for e in fake.events.values()}
    done = collector.collect(TickState(10.0, fewer))

    assert remaining == {dirs[APP_ENTITY]}
    assert {e for _, e in values(done)} == {APP_ENTITY}


def test_a_cgroup_that_vanished_before_the_window_is_skipped_quietly(
    node: tuple[FakeHost, WorkloadSnapshot, dict[str, str]], caplog: pytest.LogCaptureFixture
) -> None:
    fake_host, snap, dirs = node
    shutil.rmtree(dirs[SIDECAR_ENTITY])  # after the inventory listed it
    fake = FakePerf(counts=run_counts(dirs))
    collector = make(fake_host, fake)

    with caplog.at_level(logging.WARNING):
        collector.collect(TickState(0.0, snap))
        done = collector.collect(TickState(10.0, snap))

    assert {e for _, e in values(done)} == {APP_ENTITY}
    assert caplog.records == []


def test_without_hardware_counters_every_step_reports_unsupported_and_reprobes_hourly(
    node: tuple[FakeHost, WorkloadSnapshot, dict[str, str]],
) -> None:
    fake_host, snap, _ = node
    fake = FakePerf(fail_open={("cycles", None): errno.ENOENT})
    collector = make(fake_host, fake)

    results = [collector.collect(TickState(float(t), snap)) for t in range(0, 3600, 10)]
    probes_in_the_first_hour = fake.probes
    del fake.fail_open[("cycles", None)]
    again = collector.collect(TickState(3600.0, snap))

    assert not any(r.samples for r in results)
    reasons = {r.unsupported[cpi.SOURCE] for r in results}
    assert len(reasons) == 1
    assert "perf_event_open(cycles)" in next(iter(reasons))
    assert "ENOENT" in next(iter(reasons))
    assert probes_in_the_first_hour == 1
    assert again.unsupported == {}
    assert collector.fd_count == 2 * 2 * len(CPUS)
    collector.close()
    assert fake.events == {}


def test_on_cgroup_v1_a_missing_perf_event_hierarchy_is_unsupported_with_its_path(
    host_root: Path,
) -> None:
    fake_host = FakeHost(host_root, CgroupVersion.V1, CgroupDriver.CGROUPFS)
    collector = make(fake_host, FakePerf())

    result = collector.collect(TickState(0.0, WorkloadSnapshot()))

    root = fake_host.layout.abs_dir("perf_event", "")
    assert result.unsupported == {
        cpi.SOURCE: f"cgroup v1 controller perf_event not mounted at {root}"
    }


def test_the_runner_lists_the_unsupported_source_under_the_collector(
    node: tuple[FakeHost, WorkloadSnapshot, dict[str, str]],
) -> None:
    fake_host, snap, _ = node
    fake = FakePerf(fail_open={("cycles", None): errno.EOPNOTSUPP})
    runner = CollectorRunner([make(fake_host, fake)], MetricCache(), lambda: snap)

    runner.apply(runner.run_tick(0.0))

    assert list(runner.unsupported) == ["cpi/perf_cpi"]
    assert "EOPNOTSUPP" in runner.unsupported["cpi/perf_cpi"]


def test_a_window_longer_than_the_period_is_refused(fake_host: FakeHost) -> None:
    with pytest.raises(ConfigError, match="window"):
        cpi.CPICollector(fake_host.host, period=10.0, window=11.0)


def test_the_collector_runs_only_with_the_cpi_collector_gate_on(fake_host: FakeHost) -> None:
    off = KoordletConfig(node_name="n")
    on = KoordletConfig(node_name="n", feature_gates=parse_feature_gates("CPICollector=true"))

    without = build_collectors(CollectorContext(fake_host.host, off))
    with_gate = build_collectors(CollectorContext(fake_host.host, on))

    assert "cpi" not in [c.name for c in without]
    built = [c for c in with_gate if c.name == "cpi"]
    assert len(built) == 1
    assert built[0].interval == 1.0
    assert export_max_ages(COLLECTORS, on.collect)["koordlet_container_cpi"] == 62.0
