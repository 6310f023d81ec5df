"""PSI: parsing golden kernel files, errno mapping, trigger arguments, the collector on a fake host
of every layout, and the exported families."""

from __future__ import annotations

import dataclasses
import errno
import os
import re
import shutil
from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from apis.extension import KubeQOS
from koordlet.collectors.framework import CollectorContext
from koordlet.collectors.psi import PSICollector
from koordlet.collectors.runner import TickState
from koordlet.collectors.table import build_collectors
from koordlet.config import CollectConfig, KoordletConfig
from koordlet.errors import (
    CgroupGoneError,
    HostError,
    InvalidValueError,
    ParseError,
    UnsupportedError,
)
from koordlet.features import parse_feature_gates
from koordlet.metriccache import MetricCache
from koordlet.metriccache import series as s
from koordlet.server.exporter import FAMILIES, KoordletExporter
from koordlet.statesinformer.kubepods import KubepodsSource
from koordlet.statesinformer.model import WorkloadSnapshot
from koordlet.system.cgroups import CgroupVersion
from koordlet.system.cgroupstats import read_file_bytes
from koordlet.system.oserrors import refused_errno
from koordlet.system.paths import HostPaths
from koordlet.system.probe import Capabilities, Capability
from koordlet.system.psi import (
    CAP_SYS_RESOURCE,
    PSILine,
    PSIStats,
    arm_memcg_threshold,
    cap_sys_resource,
    drain_eventfd,
    open_psi_trigger,
    parse_psi,
    probe_memcg_threshold,
    probe_psi_trigger,
    psi_error,
    read_psi,
    trigger_spec,
)
from tests.fakehost import FakeHost, container_id

GOLDEN = Path(__file__).parents[1] / "golden" / "psi"
WELL_FORMED = sorted(p.name for p in GOLDEN.iterdir() if p.is_file() and p.suffix != ".md")
MALFORMED = sorted(p.name for p in (GOLDEN / "malformed").iterdir())
LINE = re.compile(r"^(some|full) avg10=(\S+) avg60=(\S+) avg300=(\S+) total=(\d+)$", re.M)
UID = "6f0c8d2e-1b3a-4c5d-8e9f-0a1b2c3d4e5f"
CID = container_id("app")
POD = s.pod_entity(UID)
CONTAINER = s.container_entity(UID, CID)
FILES = {"cpu": "cpu", "mem": "memory", "io": "io"}


def oracle(text: str) -> dict[str, PSILine]:
    """An independent reading of a pressure file: one regular expression per line."""
    return {
        m[1]: PSILine(float(m[2]), float(m[3]), float(m[4]), int(m[5])) for m in LINE.finditer(text)
    }


def os_error(code: int, path: str) -> OSError:
    return OSError(code, os.strerror(code), path)


# Parsing ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", WELL_FORMED)
def test_golden_pressure_files_parse_to_the_values_the_kernel_printed(name: str) -> None:
    text = (GOLDEN / name).read_text()
    expected = oracle(text)

    stats = parse_psi(text.encode(), name)

    assert stats.some == expected["some"]
    assert stats.full == expected.get("full")


def test_a_cpu_file_without_a_full_line_has_no_full_stats_rather_than_zeros() -> None:
    stats = parse_psi((GOLDEN / "cpu_before_5_13").read_bytes(), "cpu")

    assert stats.full is None
    assert stats.some.total > 0


@pytest.mark.parametrize("name", MALFORMED)
def test_a_malformed_pressure_file_raises_a_parse_error_naming_the_file(name: str) -> None:
    path = str(GOLDEN / "malformed" / name)
    with pytest.raises(ParseError, match=re.escape(path)):
        parse_psi((GOLDEN / "malformed" / name).read_bytes(), path)


hundredths = st.integers(min_value=0, max_value=10_000)


@given(
    some=st.tuples(hundredths, hundredths, hundredths, st.integers(0, 2**63 - 1)),
    full=st.none() | st.tuples(hundredths, hundredths, hundredths, st.integers(0, 2**63 - 1)),
)
def test_any_file_in_the_kernels_format_parses_back_to_its_numbers(
    some: tuple[int, int, int, int], full: tuple[int, int, int, int] | None
) -> None:
    def line(degree: str, v: tuple[int, int, int, int]) -> str:
        # psi_show(): "%s avg10=%lu.%02lu avg60=%lu.%02lu avg300=%lu.%02lu total=%llu\n"
        windows = zip((10, 60, 300), v[:3], strict=True)
        avgs = " ".join(f"avg{w}={a // 100}.{a % 100:02d}" for w, a in windows)
        return f"{degree} {avgs} total={v[3]}\n"

    text = line("some", some) + (line("full", full) if full else "")
    stats = parse_psi(text.encode(), "cpu.pressure")

    def expected(v: tuple[int, int, int, int]) -> PSILine:
        return PSILine(v[0] / 100, v[1] / 100, v[2] / 100, v[3])

    assert stats == PSIStats(expected(some), expected(full) if full else None)


def test_read_psi_reads_this_hosts_node_pressure_files() -> None:
    paths = HostPaths()
    if not os.path.isdir(paths.proc("pressure")):
        pytest.skip("this kernel has no PSI")
    for stem in FILES.values():
        assert read_psi(paths.proc("pressure", stem), cgroup=False).some.total >= 0


# Errors -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("code", [errno.EOPNOTSUPP, errno.ENOTSUP])
def test_eopnotsupp_is_unsupported_with_the_errno_never_zero(code: int) -> None:
    err = psi_error("/sys/fs/cgroup/x/cpu.pressure", os_error(code, "cpu.pressure"), cgroup=True)

    assert isinstance(err, UnsupportedError)
    assert f"errno {code}" in err.reason
    assert "psi=0" in err.reason


def test_a_missing_node_pressure_file_means_a_kernel_without_psi(tmp_path: Path) -> None:
    path = str(tmp_path / "proc" / "pressure" / "cpu")
    err = psi_error(path, os_error(errno.ENOENT, path), cgroup=False)

    assert isinstance(err, UnsupportedError)
    assert "CONFIG_PSI" in err.reason


def test_a_cgroup_without_pressure_files_is_unsupported_but_a_vanished_one_is_gone(
    tmp_path: Path,
) -> None:
    present = str(tmp_path / "cpu.pressure")
    vanished = str(tmp_path / "gone" / "cpu.pressure")

    absent = psi_error(present, os_error(errno.ENOENT, present), cgroup=True)
    gone = psi_error(vanished, os_error(errno.ENOENT, vanished), cgroup=True)

    assert isinstance(absent, UnsupportedError)
    assert str(tmp_path) in absent.reason
    assert isinstance(gone, CgroupGoneError)


def test_unsupported_cause_finds_eopnotsupp_behind_a_read_error() -> None:
    def failing_read() -> None:
        try:
            raise os_error(errno.EOPNOTSUPP, "cpu.pressure")
        except OSError as err:
            raise HostError("cpu.pressure: Operation not supported") from err

    with pytest.raises(HostError) as caught:
        failing_read()

    assert refused_errno(caught.value) == errno.EOPNOTSUPP
    assert refused_errno(HostError("plain")) is None


# Triggers and thresholds ------------------------------------------------------------------------


def test_a_trigger_spec_is_degree_stall_and_window_in_microseconds_nul_terminated() -> None:
    assert trigger_spec("some", 150_000, 2_000_000) == b"some 150000 2000000\0"
    assert trigger_spec("full", 500_000, 500_000) == b"full 500000 500000\0"


@pytest.mark.parametrize(
    ("degree", "stall", "window"),
    [
        ("partial", 1000, 1_000_000),
        ("some", 1000, 499_999),
        ("some", 1000, 10_000_001),
        ("some", 0, 1_000_000),
        ("some", 1_000_001, 1_000_000),
    ],
)
def test_a_trigger_no_kernel_accepts_is_refused_before_any_write(
    degree: str, stall: int, window: int
) -> None:
    with pytest.raises(InvalidValueError):
        trigger_spec(degree, stall, window)


def test_cap_sys_resource_is_read_from_the_effective_capability_set() -> None:
    with_cap = f"CapPrm:\t0\nCapEff:\t{1 << CAP_SYS_RESOURCE:016x}\n".encode()
    without = f"CapEff:\t{(1 << 41) - 1 - (1 << CAP_SYS_RESOURCE):016x}\n".encode()

    assert cap_sys_resource(with_cap) is True
    assert cap_sys_resource(without) is False
    assert cap_sys_resource(b"Name:\tx\n") is None


def test_a_trigger_on_a_kernel_without_psi_is_unsupported(tmp_path: Path) -> None:
    with pytest.raises(UnsupportedError, match="CONFIG_PSI"):
        open_psi_trigger(str(tmp_path / "pressure" / "cpu"), "some", 150_000, 2_000_000)


def test_a_memcg_threshold_outside_a_v1_memory_cgroup_is_unsupported(tmp_path: Path) -> None:
    before = set(os.listdir("/proc/self/fd"))

    with pytest.raises(UnsupportedError, match=r"memory\.usage_in_bytes"):
        arm_memcg_threshold(str(tmp_path), 64 << 20)
    with pytest.raises(CgroupGoneError):
        arm_memcg_threshold(str(tmp_path / "gone"), 64 << 20)
    with pytest.raises(InvalidValueError):
        arm_memcg_threshold(str(tmp_path), 0)

    assert set(os.listdir("/proc/self/fd")) <= before, "an fd leaked"


def test_draining_an_eventfd_returns_its_count_and_resets_it() -> None:
    fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
    try:
        assert drain_eventfd(fd) == 0
        os.eventfd_write(fd, 3)
        assert drain_eventfd(fd) == 3
        assert drain_eventfd(fd) == 0
    finally:
        os.close(fd)


def test_the_trigger_probe_arms_a_real_trigger_and_says_which_windows_are_allowed() -> None:
    paths = HostPaths()
    if not os.path.exists(paths.proc("pressure", "memory")):
        pytest.skip("this kernel has no PSI")
    fds = set(os.listdir("/proc/self/fd"))

    supported, reason, path = probe_psi_trigger(paths)

    assert supported, reason
    assert "CAP_SYS_RESOURCE" in reason
    assert path == paths.proc("pressure", "memory")
    assert set(os.listdir("/proc/self/fd")) <= fds


def test_the_trigger_probe_never_writes_into_a_fake_tree(fake_host: FakeHost) -> None:
    path = fake_host.paths.proc("pressure", "memory")
    before = Path(path).read_bytes()

    supported, reason, _ = probe_psi_trigger(fake_host.paths)

    assert not supported
    assert "not on procfs" in reason
    assert Path(path).read_bytes() == before


def test_the_memcg_threshold_probe_needs_cgroup_event_control(tmp_path: Path) -> None:
    (tmp_path / "v1").mkdir()
    (tmp_path / "v1" / "cgroup.event_control").write_bytes(b"")
    (tmp_path / "v2").mkdir()

    assert probe_memcg_threshold(str(tmp_path / "v1"))[0]
    supported, reason, _ = probe_memcg_threshold(str(tmp_path / "v2"))
    assert not supported
    assert "cgroup v2" in reason


# The collector ----------------------------------------------------------------------------------


def snapshot(fake: FakeHost) -> WorkloadSnapshot:
    return WorkloadSnapshot(pods=KubepodsSource(fake.host).list_pods(), generation=1)


def values(samples: Sequence[s.Sample]) -> dict[tuple[str, str], float]:
    return {(x.key.metric, x.key.entity): x.value for x in samples}


def expected_samples(text: str, resource: str, entity: str) -> dict[tuple[str, str], float]:
    """What the collector must record for one file, from the oracle."""
    lines = oracle(text)
    out = {(s.psi_full_supported_series(resource), entity): float("full" in lines)}
    for degree, line in lines.items():
        for window, value in zip(s.PSI_WINDOWS, line[:3], strict=True):
            out[(s.psi_series(resource, degree, window), entity)] = value
    return out


@pytest.fixture
def pod(fake_host: FakeHost) -> tuple[str, str]:
    pod_rel, (c_rel,) = fake_host.add_pod(UID, KubeQOS.BURSTABLE, [("containerd", CID)])
    return pod_rel, c_rel


def test_node_pressure_is_recorded_for_every_resource_degree_and_window(
    fake_host: FakeHost, pod: tuple[str, str]
) -> None:
    result = PSICollector(fake_host.host).collect(TickState(100.0, snapshot(fake_host)))
    got = values(result.samples)

    for res, stem in FILES.items():
        text = Path(fake_host.paths.proc("pressure", stem)).read_text()
        for key, value in expected_samples(text, res, s.NODE).items():
            assert got[key] == value


def test_pods_and_containers_report_their_cgroup_pressure_on_cgroup_v2(
    fake_host: FakeHost, pod: tuple[str, str]
) -> None:
    if fake_host.version is CgroupVersion.V1:
        pytest.skip("v1 cgroups have no pressure files: see the next test")
    pod_rel, c_rel = pod
    fake_host.set_pressure(
        "cpu", 5_000_000, 4_000_000, some_avg10=12.5, full_avg10=7.25, rel=pod_rel
    )
    fake_host.set_pressure("memory", 900, 800, some_avg10=0.5, full_avg10=0.25, rel=c_rel)

    result = PSICollector(fake_host.host).collect(TickState(100.0, snapshot(fake_host)))
    got = values(result.samples)

    assert result.unsupported == {}
    for entity, rel in ((POD, pod_rel), (CONTAINER, c_rel)):
        for res, stem in FILES.items():
            text = fake_host.read("cpu", rel, f"{stem}.pressure")
            for key, value in expected_samples(text, res, entity).items():
                assert got[key] == value
    assert got[(s.psi_series("cpu", "some", "avg10"), POD)] == 12.5
    assert got[(s.psi_series("mem", "full", "avg10"), CONTAINER)] == 0.25


def test_v1_cgroups_without_pressure_files_are_unsupported_with_the_reason(
    fake_host: FakeHost, pod: tuple[str, str]
) -> None:
    if fake_host.version is CgroupVersion.V2:
        pytest.skip("v2 cgroups have pressure files")

    result = PSICollector(fake_host.host).collect(TickState(100.0, snapshot(fake_host)))

    assert "cpuacct" in result.unsupported["cgroup"]
    assert "psi_v1" in result.unsupported["cgroup"]
    assert not any(x.key.entity in (POD, CONTAINER) for x in result.samples)
    assert any(x.key.entity == s.NODE for x in result.samples)


def test_a_cpu_file_without_full_records_no_full_series_and_a_zero_flag(
    fake_host: FakeHost, pod: tuple[str, str]
) -> None:
    shutil.copyfile(GOLDEN / "cpu_before_5_13", fake_host.paths.proc("pressure", "cpu"))

    got = values(PSICollector(fake_host.host).collect(TickState(1.0, snapshot(fake_host))).samples)

    assert got[(s.psi_full_supported_series("cpu"), s.NODE)] == 0.0
    assert got[(s.psi_full_supported_series("mem"), s.NODE)] == 1.0
    assert not [k for k in got if k[0].startswith("psi_cpu_full_avg") and k[1] == s.NODE]
    assert got[(s.psi_series("cpu", "some", "avg10"), s.NODE)] == 0.22


def test_a_node_without_proc_pressure_is_unsupported_and_pods_are_still_read(
    fake_host: FakeHost, pod: tuple[str, str]
) -> None:
    shutil.rmtree(fake_host.paths.proc("pressure"))

    result = PSICollector(fake_host.host).collect(TickState(1.0, snapshot(fake_host)))

    assert "CONFIG_PSI" in result.unsupported["node"]
    assert not any(x.key.entity == s.NODE for x in result.samples)
    if fake_host.version is CgroupVersion.V2:
        assert any(x.key.entity == POD for x in result.samples)


def eopnotsupp_reader(path: str) -> bytes:
    """The read a kernel booted with psi=0 gives for cgroup pressure files: EOPNOTSUPP."""
    if path.endswith(".pressure") or "/pressure/" in path:
        try:
            raise os_error(errno.EOPNOTSUPP, path)
        except OSError as err:
            raise HostError(f"{path}: {err.strerror}") from err
    return read_file_bytes(path)


def test_eopnotsupp_from_the_kernel_makes_node_and_cgroup_pressure_unsupported(
    fake_host: FakeHost, pod: tuple[str, str]
) -> None:
    if fake_host.version is CgroupVersion.V1:
        pytest.skip("v1 fake cgroups have no pressure files to refuse")
    tick = TickState(1.0, snapshot(fake_host), read=eopnotsupp_reader)

    result = PSICollector(fake_host.host).collect(tick)

    assert result.samples == []
    assert f"errno {errno.EOPNOTSUPP}" in result.unsupported["node"]
    assert f"errno {errno.EOPNOTSUPP}" in result.unsupported["cgroup"]


def test_a_pod_whose_cgroup_vanished_is_skipped_without_being_unsupported(
    fake_host: FakeHost, pod: tuple[str, str]
) -> None:
    if fake_host.version is CgroupVersion.V1:
        pytest.skip("v1 fake cgroups have no pressure files")
    other = "0a9b8c7d-6e5f-4a3b-9c2d-1e0f9a8b7c6d"
    fake_host.add_pod(other, KubeQOS.BESTEFFORT)
    snap = snapshot(fake_host)
    fake_host.remove_cgroup(pod[0])

    result = PSICollector(fake_host.host).collect(TickState(1.0, snap))
    entities = {x.key.entity for x in result.samples}

    assert result.unsupported == {}
    assert s.pod_entity(other) in entities
    assert POD not in entities
    assert CONTAINER not in entities


def test_a_v2_cgroup_with_pressure_disabled_is_unsupported_naming_it(
    fake_host: FakeHost, pod: tuple[str, str]
) -> None:
    if fake_host.version is CgroupVersion.V1:
        pytest.skip("v2 only: cgroup.pressure=0 hides a cgroup's pressure files")
    c_dir = fake_host.layout.abs_dir("cpu", pod[1])
    for stem in FILES.values():
        os.unlink(os.path.join(c_dir, f"{stem}.pressure"))

    result = PSICollector(fake_host.host).collect(TickState(1.0, snapshot(fake_host)))

    assert c_dir in result.unsupported["cgroup"]
    assert any(x.key.entity == POD for x in result.samples)


def test_when_the_probe_found_no_cgroup_psi_no_cgroup_file_is_read(
    fake_host: FakeHost, pod: tuple[str, str]
) -> None:
    caps = Capabilities(
        [Capability("psi_cgroup", False, "file cpu.pressure absent", "")], fake_host.version
    )
    reads: list[str] = []

    def counting(path: str) -> bytes:
        reads.append(path)
        return read_file_bytes(path)

    tick = TickState(1.0, snapshot(fake_host), read=counting)
    result = PSICollector(fake_host.host, capabilities=caps).collect(tick)

    assert result.unsupported["cgroup"] == "start-up probe: file cpu.pressure absent"
    assert all(p.startswith(fake_host.paths.proc()) for p in reads)


def test_a_malformed_node_file_fails_the_step(fake_host: FakeHost) -> None:
    shutil.copyfile(GOLDEN / "malformed" / "not_a_number", fake_host.paths.proc("pressure", "io"))

    with pytest.raises(ParseError, match="pressure/io"):
        PSICollector(fake_host.host).collect(TickState(1.0, snapshot(fake_host)))


def test_the_table_runs_psi_only_with_the_psicollector_gate_at_the_psi_interval(
    fake_host: FakeHost,
) -> None:
    off = KoordletConfig(node_name="n")
    on = KoordletConfig(
        node_name="n",
        feature_gates=parse_feature_gates("PSICollector=true"),
        collect=CollectConfig(psi_interval=30.0),
    )

    without = build_collectors(CollectorContext(fake_host.host, off))
    with_gate = {c.name: c for c in build_collectors(CollectorContext(fake_host.host, on))}

    assert "psi" not in [c.name for c in without]
    assert with_gate["psi"].interval == 30.0
    assert isinstance(with_gate["psi"], PSICollector)
    default = dataclasses.replace(on, collect=CollectConfig())
    built = build_collectors(CollectorContext(fake_host.host, default))
    assert next(c.interval for c in built if c.name == "psi") == 10.0  # Koordinator's


# Export -----------------------------------------------------------------------------------------


def exported(fake: FakeHost, cache: MetricCache) -> dict[str, list[dict[str, str]]]:
    exporter = KoordletExporter(
        cache, lambda: snapshot(fake), node_name="n1", collect_interval=1.0, clock=lambda: 101.0
    )
    return {
        f.name: [dict(x.labels, value=str(x.value)) for x in f.samples]
        for f in exporter.collect()
        if f.name.endswith("_psi")
    }


def collect_into(fake: FakeHost, now: float) -> MetricCache:
    cache = MetricCache(clock=lambda: now)
    result = PSICollector(fake.host).collect(TickState(now, snapshot(fake)))
    cache.append(now, result.samples)
    return cache


def test_psi_families_carry_koordinators_labels_and_one_sample_per_value(
    fake_host: FakeHost, pod: tuple[str, str]
) -> None:
    if fake_host.version is CgroupVersion.V1:
        pytest.skip("v1 fake cgroups have no pressure files")
    got = exported(fake_host, collect_into(fake_host, 100.0))

    specs = {f.name: f for f in FAMILIES}
    psi_labels = ["psi_resource_type", "psi_precision", "psi_degree", "cpu_full_supported"]
    assert list(specs["koordlet_pod_psi"].labels) == [
        "node", "pod_uid", "pod_name", "pod_namespace", *psi_labels
    ]  # fmt: skip
    assert list(specs["koordlet_container_psi"].labels) == [
        "node", "container_id", "container_name", "pod_uid", "pod_name", "pod_namespace",
        *psi_labels,
    ]  # fmt: skip
    for name in ("koordlet_node_psi", "koordlet_pod_psi", "koordlet_container_psi"):
        assert len(got[name]) == 18  # 3 resources x 2 degrees x 3 windows, full supported
        assert {x["cpu_full_supported"] for x in got[name]} == {"true"}


def test_without_full_cpu_only_some_is_exported_and_says_full_is_unsupported(
    fake_host: FakeHost,
) -> None:
    shutil.copyfile(GOLDEN / "cpu_before_5_13", fake_host.paths.proc("pressure", "cpu"))

    node = exported(fake_host, collect_into(fake_host, 100.0))["koordlet_node_psi"]
    cpu = [x for x in node if x["psi_resource_type"] == "cpu"]

    assert {(x["psi_degree"], x["cpu_full_supported"]) for x in cpu} == {("some", "false")}
    assert len(cpu) == 3
    assert len([x for x in node if x["psi_resource_type"] == "mem"]) == 6


def test_label_values_use_koordinators_spelling(fake_host: FakeHost) -> None:
    node = exported(fake_host, collect_into(fake_host, 100.0))["koordlet_node_psi"]

    assert {x["psi_resource_type"] for x in node} == {"cpu", "mem", "io"}
    assert {x["psi_precision"] for x in node} == {"avg10", "avg60", "avg300"}
    assert {x["psi_degree"] for x in node} == {"some", "full"}
