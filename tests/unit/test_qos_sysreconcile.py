"""System config: Koordinator's min_free_kbytes formula and ranges, and what rounds write on a
fake /proc/sys tree (including the restore when a setting is unset again)."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from apis.slo_strategies import SystemStrategy
from koordlet.collectors.nodeinfo import node_info_dict
from koordlet.errors import InvalidValueError, ParseError, UnsupportedError
from koordlet.executor import CgroupWriter
from koordlet.executor.sysctl import (
    MEMCG_REAP_BACKGROUND,
    MIN_FREE_KBYTES,
    SYSTEM_FILES,
    WATERMARK_SCALE_FACTOR,
    SystemFileWriter,
    system_file,
)
from koordlet.executor.writer import WriteResult
from koordlet.metriccache.store import MetricCache
from koordlet.qos.framework import QoSBook, StrategyContext
from koordlet.qos.sysreconcile import (
    SystemConfigStrategy,
    desired_settings,
    min_free_kbytes,
    node_memory_total,
)
from koordlet.statesinformer.model import WorkloadSnapshot
from koordlet.system.cgroups import CgroupDriver, CgroupVersion
from koordlet.system.topology import read_cpu_topology
from tests.fakehost import FakeHost
from tests.strategyrig import config, in_force

GIB = 1 << 30


@pytest.mark.parametrize(
    ("total", "factor", "expected"),
    [
        (512 * GIB, 100, 512 * GIB // 1024 * 100 // 10000),  # upstream's own test case
        (16 * GIB, 100, 167772),  # 16777216 kB * 100 / 10000, truncated
        (16 * GIB, 1, 1677),
        (1000 * 1024 + 1023, 10000, 1000),  # bytes below a kB do not count
    ],
)
def test_min_free_kbytes_is_total_kb_times_factor_over_10000(
    total: int, factor: int, expected: int
) -> None:
    assert min_free_kbytes(total, factor) == expected


@pytest.mark.parametrize(
    ("strategy", "total", "expected"),
    [
        (SystemStrategy(), 16 * GIB, {}),
        (
            SystemStrategy(min_free_kbytes_factor=100, watermark_scale_factor=150),
            16 * GIB,
            {"vm.min_free_kbytes": 167772, "vm.watermark_scale_factor": 150},
        ),
        # 1 GiB * 1/10000 = 104 kB: below the 10240 kB floor, refused rather than clamped
        (
            SystemStrategy(min_free_kbytes_factor=1),
            GIB,
            {"vm.min_free_kbytes": "104 outside 10240..10485760: not written"},
        ),
        # watermark_scale_factor 5 passes the CRD (>0) but not the koordlet's 10..400
        (
            SystemStrategy(watermark_scale_factor=5),
            GIB,
            {"vm.watermark_scale_factor": "5 outside 10..400: not written"},
        ),
        (
            SystemStrategy(min_free_kbytes_factor=100),
            None,
            {"vm.min_free_kbytes": "node memory total unknown (no node info yet)"},
        ),
        (SystemStrategy(memcg_reap_background=1), GIB, {"memcg_reap_background": 1}),
    ],
)
def test_desired_settings_follow_the_strategy_and_the_ranges(
    strategy: SystemStrategy, total: int | None, expected: dict[str, Any]
) -> None:
    got = {f.name: v for f, v in desired_settings(strategy, total).items() if v is not None}
    assert got == expected


def test_node_memory_total_sums_the_numa_nodes(host_root: Path) -> None:
    fake = FakeHost(host_root, CgroupVersion.V1, CgroupDriver.CGROUPFS, ncpus=4, numa_nodes=2)
    info = node_info_dict(read_cpu_topology(fake.paths))
    assert node_memory_total(info) == 2 * 16 * GIB
    assert node_memory_total(None) is None
    assert node_memory_total({"numa": {}}) is None


# The writer -----------------------------------------------------------------------------------


def _vm(fake: FakeHost, name: str, value: int) -> str:
    path = fake.paths.proc("sys", "vm", name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    Path(path).write_text(f"{value}\n")
    return path


def test_system_file_writer_writes_only_changes_and_audits_them(host_root: Path) -> None:
    fake = FakeHost(host_root, CgroupVersion.V1, CgroupDriver.CGROUPFS)
    path = _vm(fake, "watermark_scale_factor", 10)
    seen: list[WriteResult] = []
    writer = SystemFileWriter(fake.paths, on_change=seen.append)
    first = writer.write(WATERMARK_SCALE_FACTOR, 150, strategy="s", reason="r")
    second = writer.write(WATERMARK_SCALE_FACTOR, 150, strategy="s", reason="r")
    assert Path(path).read_text().strip() == "150"
    assert (first.changed, first.old, first.new) == (True, "10", "150")
    assert not second.changed
    assert [r.new for r in seen] == ["150"]


def test_system_file_writer_refuses_out_of_range_and_names_absent_files(host_root: Path) -> None:
    fake = FakeHost(host_root, CgroupVersion.V1, CgroupDriver.CGROUPFS)
    path = _vm(fake, "min_free_kbytes", 67584)
    writer = SystemFileWriter(fake.paths)
    with pytest.raises(InvalidValueError, match=r"10240\.\.10485760"):
        writer.write(MIN_FREE_KBYTES, 100)
    assert Path(path).read_text().strip() == "67584"
    with pytest.raises(UnsupportedError, match=r"reap_background absent \(Anolis"):
        writer.write(MEMCG_REAP_BACKGROUND, 1)
    assert writer.probe(MEMCG_REAP_BACKGROUND)[0] is False
    assert writer.probe(MIN_FREE_KBYTES)[0] is True


def test_the_sysctl_table_declares_each_setting_once_with_codec_and_range(
    host_root: Path,
) -> None:
    """The rows are the objects callers pass; a name only resolves what was persisted by name."""
    assert list(SYSTEM_FILES) == [
        "vm.min_free_kbytes",
        "vm.watermark_scale_factor",
        "memcg_reap_background",
    ]
    for f in SYSTEM_FILES.values():
        assert system_file(f.name) is f
        assert f.codec.decode(f.codec.encode(f.valid.lo, None)) == f.valid.lo
    with pytest.raises(UnsupportedError, match="no such setting"):
        system_file("vm.swappiness")
    fake = FakeHost(host_root, CgroupVersion.V1, CgroupDriver.CGROUPFS)
    path = _vm(fake, "watermark_scale_factor", 10)
    Path(path).write_text("ten\n")
    with pytest.raises(ParseError, match="watermark_scale_factor: not a decimal integer"):
        SystemFileWriter(fake.paths).read(WATERMARK_SCALE_FACTOR)


# The strategy ---------------------------------------------------------------------------------


@pytest.fixture
def rig(host_root: Path) -> Iterator[SimpleNamespace]:
    fake = FakeHost(host_root, CgroupVersion.V1, CgroupDriver.CGROUPFS)
    files = {
        "min": _vm(fake, "min_free_kbytes", 67584),
        "wsf": _vm(fake, "watermark_scale_factor", 10),
    }
    cache = MetricCache()
    cache.set_info("node_info", node_info_dict(read_cpu_topology(fake.paths)))
    box: dict[str, Any] = {"slo": in_force(systemStrategy={"minFreeKbytesFactor": 100})}
    audit: list[WriteResult] = []
    writer = CgroupWriter(fake.host, on_change=audit.append)
    writer.start()
    book = QoSBook()
    ctx = StrategyContext(
        host=lambda: fake.host,
        config=config(),
        cache=cache,
        executor=writer,
        workloads=WorkloadSnapshot,
        node_slo=lambda: box["slo"],
        book=book,
    )
    try:
        yield SimpleNamespace(fake=fake, files=files, box=box, audit=audit, book=book, ctx=ctx)
    finally:
        writer.stop()


def _read(path: str) -> int:
    return int(Path(path).read_text())


async def test_a_round_sets_min_free_kbytes_from_node_memory(rig: SimpleNamespace) -> None:
    strategy = SystemConfigStrategy(rig.ctx)
    await strategy.reconcile()
    assert _read(rig.files["min"]) == 167772  # 16 GiB fake node, factor 100
    assert _read(rig.files["wsf"]) == 10  # unset: left alone
    assert [(r.path, r.old, r.new) for r in rig.audit] == [(rig.files["min"], "67584", "167772")]
    report = rig.book.last_report("sysreconcile")
    assert report is not None
    assert "vm.min_free_kbytes=167772" in report.decision


async def test_min_free_kbytes_follows_the_node_memory_under_the_same_nodeslo(
    rig: SimpleNamespace, host_root: Path
) -> None:
    # the decision is kept while the strategy and the memory total are equal: a new total shows
    strategy = SystemConfigStrategy(rig.ctx)
    await strategy.reconcile()
    assert _read(rig.files["min"]) == 167772
    bigger = FakeHost(host_root / "bigger", CgroupVersion.V1, CgroupDriver.CGROUPFS, numa_nodes=2)
    rig.ctx.cache.set_info("node_info", node_info_dict(read_cpu_topology(bigger.paths)))
    await strategy.reconcile()
    assert _read(rig.files["min"]) == 2 * 167772  # 32 GiB
    report = rig.book.last_report("sysreconcile")
    assert report is not None
    assert report.inputs["memory_total_bytes"] == 32 * GIB


async def test_the_default_nodeslo_writes_no_kernel_setting(rig: SimpleNamespace) -> None:
    """Upstream's DefaultSystemStrategy (at the version of our CRDs) leaves every knob unset: a
    node whose NodeSLO has no systemStrategy keeps its kernel values."""
    rig.box["slo"] = in_force()
    strategy = SystemConfigStrategy(rig.ctx)
    await strategy.reconcile()
    assert (_read(rig.files["min"]), _read(rig.files["wsf"])) == (67584, 10)
    assert rig.audit == []
    report = rig.book.last_report("sysreconcile")
    assert report is not None
    assert report.decision == "nothing to do: no setting asked"


async def test_unsetting_a_field_restores_the_host_value(rig: SimpleNamespace) -> None:
    strategy = SystemConfigStrategy(rig.ctx)
    rig.box["slo"] = in_force(
        systemStrategy={"minFreeKbytesFactor": 100, "watermarkScaleFactor": 150}
    )
    await strategy.reconcile()
    assert (_read(rig.files["min"]), _read(rig.files["wsf"])) == (167772, 150)
    rig.box["slo"] = in_force(systemStrategy={"watermarkScaleFactor": 150})
    await strategy.reconcile()
    assert (_read(rig.files["min"]), _read(rig.files["wsf"])) == (67584, 150)
    rig.box["slo"] = in_force()  # the whole section gone
    await strategy.reconcile()
    assert (_read(rig.files["min"]), _read(rig.files["wsf"])) == (67584, 10)
    await strategy.reconcile()  # nothing remembered any more: nothing written
    assert len(rig.audit) == 4


async def test_a_value_outside_the_range_is_reported_and_not_written(rig: SimpleNamespace) -> None:
    rig.box["slo"] = in_force(systemStrategy={"minFreeKbytesFactor": 1})
    strategy = SystemConfigStrategy(rig.ctx)
    await strategy.reconcile()
    assert _read(rig.files["min"]) == 67584
    report = rig.book.last_report("sysreconcile")
    assert report is not None
    assert "outside 10240..10485760" in report.detail["results"]["vm.min_free_kbytes"]


async def test_dry_run_audits_the_would_be_change_and_writes_nothing(rig: SimpleNamespace) -> None:
    dry = CgroupWriter(
        rig.fake.host, on_change=rig.audit.append, dry_run_strategies=frozenset({"sysreconcile"})
    )
    with dry:  # started, as the daemon's is
        await SystemConfigStrategy(replace(rig.ctx, executor=dry)).reconcile()
    assert _read(rig.files["min"]) == 67584
    assert [(r.dry_run, r.new) for r in rig.audit] == [(True, "167772")]


async def test_an_absent_anolis_file_is_reported_unsupported(rig: SimpleNamespace) -> None:
    rig.box["slo"] = in_force(systemStrategy={"memcgReapBackGround": 1})
    strategy = SystemConfigStrategy(rig.ctx)
    await strategy.reconcile()
    report = rig.book.last_report("sysreconcile")
    assert report is not None
    assert report.detail["results"]["memcg_reap_background"].startswith("unsupported: ")
    assert "Anolis kernels only" in report.detail["results"]["memcg_reap_background"]


async def test_writes_run_through_the_executors_call_hook_when_it_has_one(
    rig: SimpleNamespace,
) -> None:
    threads: list[str] = []
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="writer-hook")

    class WithCall(CgroupWriter):
        def call(self, fn: Callable[[], Any]) -> Future[Any]:
            def run() -> Any:
                threads.append(threading.current_thread().name)
                return fn()

            return pool.submit(run)

    try:
        executor = WithCall(rig.fake.host)
        await SystemConfigStrategy(replace(rig.ctx, executor=executor)).reconcile()
    finally:
        pool.shutdown()
    assert _read(rig.files["min"]) == 167772
    assert threads == ["writer-hook_0"]
