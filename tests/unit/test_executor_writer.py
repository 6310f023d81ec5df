"""The single cgroup writer on fake v1 and v2 trees: what reaches the files, and what does not."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from koordlet.errors import CgroupGoneError, HostError, InvalidValueError, UnsupportedError
from koordlet.executor import CgroupWriter, WriteResult
from koordlet.system import cgroupstats
from koordlet.system.cgroups import CgroupDriver, CgroupVersion, detect_layout
from koordlet.system.host import Host
from koordlet.system.knobs import (
    CPU_BVT_WARP_NS,
    CPU_CFS_PERIOD,
    CPU_CFS_QUOTA,
    CPU_IDLE,
    CPU_SHARES,
    MEMORY_IDLE_PAGE_STATS,
    MEMORY_LIMIT,
    Knob,
)
from koordlet.system.paths import HostPaths
from koordlet.system.probe import Capabilities, Capability

POD = "kubepods/besteffort/pod1234"

V1_FILES = {
    "cpu": {"cpu.shares": "1024\n", "cpu.cfs_quota_us": "-1\n", "cpu.cfs_period_us": "100000\n"},
    "memory": {"memory.limit_in_bytes": "9223372036854771712\n"},
}
V2_FILES = {
    "cpu.weight": "100\n",
    "cpu.max": "max 50000\n",
    "memory.max": "max\n",
}


class FakeClock:
    """``time.monotonic`` that moves only when told."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make_host(tmp_path: Path, version: CgroupVersion) -> Host:
    paths = HostPaths(cgroup_root=str(tmp_path / "cgroup"))
    layout = detect_layout(paths, version=version, driver=CgroupDriver.CGROUPFS)
    root = Path(paths.cgroup_root)
    if version is CgroupVersion.V1:
        for ctrl, files in V1_FILES.items():
            (root / ctrl / POD).mkdir(parents=True)
            for name, text in files.items():
                (root / ctrl / POD / name).write_text(text)
    else:
        (root / POD).mkdir(parents=True)
        for name, text in V2_FILES.items():
            (root / POD / name).write_text(text)
    return Host(paths, layout)


@pytest.fixture(params=[CgroupVersion.V1, CgroupVersion.V2], ids=["v1", "v2"])
def host(request: pytest.FixtureRequest, tmp_path: Path) -> Host:
    version: CgroupVersion = request.param
    return make_host(tmp_path, version)


@pytest.fixture
def v1(tmp_path: Path) -> Host:
    return make_host(tmp_path, CgroupVersion.V1)


@pytest.fixture
def v2(tmp_path: Path) -> Host:
    return make_host(tmp_path, CgroupVersion.V2)


def text_of(host: Host, controller: str, filename: str, rel: str = POD) -> str:
    return Path(host.layout.file(controller, rel, filename)).read_text().strip()


def recorder() -> tuple[list[WriteResult], Callable[[WriteResult], None]]:
    seen: list[WriteResult] = []
    return seen, seen.append


# Writes that land ------------------------------------------------------------------------------


def test_cpu_shares_land_as_shares_on_v1_and_as_weight_on_v2(host: Host) -> None:
    result = CgroupWriter(host).write(CPU_SHARES, POD, 2048)
    assert result.changed
    name = "cpu.shares" if host.layout.version is CgroupVersion.V1 else "cpu.weight"
    expected = "2048" if host.layout.version is CgroupVersion.V1 else "79"  # 1 + 2046*9999//262142
    assert text_of(host, "cpu", name) == expected == result.new
    assert result.path == host.layout.file("cpu", POD, name)


def test_the_quota_is_written_without_the_caller_knowing_the_version(host: Host) -> None:
    CgroupWriter(host).write(CPU_CFS_QUOTA, POD, 25000)
    if host.layout.version is CgroupVersion.V1:
        assert text_of(host, "cpu", "cpu.cfs_quota_us") == "25000"
    else:
        assert text_of(host, "cpu", "cpu.max") == "25000 50000"  # the period survives


def test_the_period_on_v2_keeps_the_quota(v2: Host) -> None:
    writer = CgroupWriter(v2)
    writer.write(CPU_CFS_QUOTA, POD, 20000)
    result = writer.write(CPU_CFS_PERIOD, POD, 100000)
    assert (result.old, result.new) == ("20000 50000", "20000 100000")
    assert text_of(v2, "cpu", "cpu.max") == "20000 100000"


def test_a_changed_write_reports_the_old_text_and_calls_the_hook(v1: Host) -> None:
    seen, hook = recorder()
    result = CgroupWriter(v1, on_change=hook).write(CPU_SHARES, POD, 512)
    assert (result.old, result.new, result.changed, result.knob) == (
        "1024",
        "512",
        True,
        "cpu_shares",
    )
    assert seen == [result]


# Writes that are skipped -----------------------------------------------------------------------


def test_a_value_already_in_the_file_is_not_written(host: Host) -> None:
    seen, hook = recorder()
    result = CgroupWriter(host, on_change=hook).write(MEMORY_LIMIT, POD, None)
    assert not result.changed
    assert seen == []


def test_a_file_longer_than_one_read_is_read_to_its_end(
    v1: Host, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The writer reads with ``os.read`` until EOF (``cgroupstats.read_whole``): a value split
    over several reads (here from 4 bytes a read) is read whole, and compared whole."""
    monkeypatch.setattr(cgroupstats, "READ_BUFFER", 4)
    writer = CgroupWriter(v1)
    assert writer.read(MEMORY_LIMIT, POD) is None  # 9223372036854771712: 20 bytes
    assert not writer.write(MEMORY_LIMIT, POD, None).changed
    assert writer.write(MEMORY_LIMIT, POD, 1 << 30).changed
    assert writer.read(MEMORY_LIMIT, POD) == 1 << 30


def test_a_new_layout_resolves_its_own_paths(v1: Host, tmp_path: Path) -> None:
    """The writer remembers resolved paths for one layout only: a host detected again (another
    cgroup root) writes into its own tree."""
    writer = CgroupWriter(v1)
    writer.write(CPU_SHARES, POD, 512)
    other = make_host(tmp_path / "other", CgroupVersion.V1)
    writer.host = other
    writer.resync()
    assert writer.write(CPU_SHARES, POD, 256).changed
    assert text_of(other, "cpu", "cpu.shares") == "256"
    assert text_of(v1, "cpu", "cpu.shares") == "512"


def test_v1_unlimited_memory_is_not_rewritten_as_minus_one(v1: Host) -> None:
    result = CgroupWriter(v1).write(MEMORY_LIMIT, POD, -1)
    assert not result.changed
    assert text_of(v1, "memory", "memory.limit_in_bytes") == "9223372036854771712"


def test_a_repeated_value_is_skipped_from_cache_until_the_ttl_forces_a_refresh(v1: Host) -> None:
    clock = FakeClock()
    writer = CgroupWriter(v1, cache_ttl=60, clock=clock)
    writer.write(CPU_SHARES, POD, 512)
    path = Path(v1.layout.file("cpu", POD, "cpu.shares"))
    path.write_text("700\n")  # someone else changed it behind our back

    clock.now += 59
    assert not writer.write(CPU_SHARES, POD, 512).changed
    assert path.read_text().strip() == "700"

    clock.now += 2
    result = writer.write(CPU_SHARES, POD, 512)
    assert (result.changed, result.old) == (True, "700")
    assert path.read_text().strip() == "512"


def test_forgetting_a_cgroup_drops_its_cached_values(v1: Host) -> None:
    writer = CgroupWriter(v1)
    writer.write(CPU_SHARES, POD, 512)
    writer.write(MEMORY_LIMIT, POD, 1 << 30)
    Path(v1.layout.file("cpu", POD, "cpu.shares")).write_text("700\n")
    assert writer.forget("kubepods/besteffort") == 2
    assert writer.write(CPU_SHARES, POD, 512).changed


# Writes that are refused -----------------------------------------------------------------------


@pytest.mark.parametrize(("knob", "value"), [(CPU_SHARES, 1), (CPU_CFS_QUOTA, 999)])
def test_an_out_of_range_value_is_refused_and_never_written(
    host: Host, knob: Knob[Any], value: int
) -> None:
    seen, hook = recorder()
    before = {p: p.read_text() for p in Path(host.paths.cgroup_root).rglob("*") if p.is_file()}
    with pytest.raises(InvalidValueError, match=knob.name):
        CgroupWriter(host, on_change=hook).write(knob, POD, value)
    after = {p: p.read_text() for p in Path(host.paths.cgroup_root).rglob("*") if p.is_file()}
    assert after == before
    assert seen == []


def test_a_knob_whose_file_is_absent_is_unsupported(host: Host) -> None:
    with pytest.raises(UnsupportedError, match="cpu_bvt_warp_ns"):
        CgroupWriter(host).write(CPU_BVT_WARP_NS, POD, 2)
    assert not Path(host.layout.file("cpu", POD, "cpu.bvt_warp_ns")).exists()


def test_a_knob_probed_unsupported_is_refused_with_the_probe_reason(v1: Host) -> None:
    caps = Capabilities(
        [Capability("cpu_idle", False, "file cpu.idle absent (Linux >= 5.15)", "")],
        CgroupVersion.V1,
    )
    with pytest.raises(UnsupportedError, match=r"Linux >= 5\.15"):
        CgroupWriter(v1, capabilities=caps).write(CPU_IDLE, POD, 1)


def test_a_read_only_knob_is_refused(v1: Host) -> None:
    with pytest.raises(UnsupportedError, match="read-only"):
        CgroupWriter(v1).write(MEMORY_IDLE_PAGE_STATS, POD, "")


def test_a_removed_cgroup_is_a_gone_error(host: Host) -> None:
    with pytest.raises(CgroupGoneError, match="pod-gone"):
        CgroupWriter(host).write(CPU_SHARES, "kubepods/besteffort/pod-gone", 512)


def test_a_file_that_cannot_be_opened_is_a_host_error_naming_it(v1: Host) -> None:
    target = Path(v1.layout.file("cpu", POD, "cpu.shares"))
    target.unlink()
    target.mkdir()  # exists, but cannot be read or written as a file
    with pytest.raises(HostError, match=r"cpu\.shares") as info:
        CgroupWriter(v1).write(CPU_SHARES, POD, 512)
    assert not isinstance(info.value, CgroupGoneError | UnsupportedError)


# The writer thread -----------------------------------------------------------------------------


def test_submitted_writes_run_on_the_single_writer_thread(v1: Host) -> None:
    threads: list[str] = []
    writer = CgroupWriter(v1, on_change=lambda _: threads.append(threading.current_thread().name))
    with writer:
        futures = [writer.submit(CPU_SHARES, POD, s) for s in (300, 400, 500)]
        results = [f.result(timeout=10) for f in futures]
    assert [r.new for r in results] == ["300", "400", "500"]
    assert len(set(threads)) == 1
    assert threads[0].startswith("cgroup-writer")
    assert text_of(v1, "cpu", "cpu.shares") == "500"


def test_a_submitted_write_carries_its_error_in_the_future(v1: Host) -> None:
    with CgroupWriter(v1) as writer:
        future = writer.submit(CPU_SHARES, POD, 0)
        with pytest.raises(InvalidValueError):
            future.result(timeout=10)


def test_submitting_before_start_is_a_programming_error(v1: Host) -> None:
    with pytest.raises(RuntimeError, match="start"):
        CgroupWriter(v1).submit(CPU_SHARES, POD, 512)


def test_a_failing_hook_does_not_undo_a_done_write(
    v1: Host, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(_: WriteResult) -> None:
        raise ValueError("audit log full")

    with caplog.at_level(logging.ERROR, logger="koordlet.executor.writer"):
        result = CgroupWriter(v1, on_change=broken).write(CPU_SHARES, POD, 512)
    assert result.changed
    assert text_of(v1, "cpu", "cpu.shares") == "512"
    assert "on_change hook failed" in caplog.text
