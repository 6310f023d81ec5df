"""The executor's safety promises on fake trees: dry run writes nothing, a start trusts no
cache, a shutdown never leaves a batch half-applied, every write is timed."""

from __future__ import annotations

import threading
from pathlib import Path

from koordlet.executor import AuditLog, BatchWrite, CgroupWriter, WriteResult
from koordlet.system.cgroups import CgroupDriver, CgroupVersion, detect_layout
from koordlet.system.host import Host
from koordlet.system.knobs import CPU_CFS_QUOTA, CPU_SHARES
from koordlet.system.paths import HostPaths

PODS = ("kubepods/besteffort/pod1", "kubepods/besteffort/pod2")


def v1_host(tmp_path: Path) -> Host:
    paths = HostPaths(cgroup_root=str(tmp_path / "cgroup"))
    layout = detect_layout(paths, version=CgroupVersion.V1, driver=CgroupDriver.CGROUPFS)
    for rel in PODS:
        d = tmp_path / "cgroup" / "cpu" / rel
        d.mkdir(parents=True)
        (d / "cpu.cfs_quota_us").write_text("-1\n")
        (d / "cpu.shares").write_text("1024\n")
    return Host(paths, layout)


def quota(tmp_path: Path, rel: str) -> str:
    return (tmp_path / "cgroup" / "cpu" / rel / "cpu.cfs_quota_us").read_text()


def test_global_dry_run_reads_compares_and_audits_but_writes_nothing(tmp_path: Path) -> None:
    audit = AuditLog(None)
    writer = CgroupWriter(v1_host(tmp_path), on_change=audit.on_write, dry_run_all=True)
    result = writer.write(CPU_CFS_QUOTA, PODS[0], 20000, strategy="cpusuppress", reason="high")
    assert (result.changed, result.dry_run, result.old, result.new) == (False, True, "-1", "20000")
    assert quota(tmp_path, PODS[0]) == "-1\n"
    (entry,) = audit.recent()
    assert (entry.kind, entry.dry_run, entry.old, entry.new) == ("decision", True, "-1", "20000")
    assert (entry.strategy, entry.reason) == ("cpusuppress", "high")


def test_a_dry_run_write_that_would_change_nothing_is_not_audited(tmp_path: Path) -> None:
    audit = AuditLog(None)
    writer = CgroupWriter(v1_host(tmp_path), on_change=audit.on_write, dry_run_all=True)
    assert not writer.write(CPU_SHARES, PODS[0], 1024, strategy="s").changed
    assert audit.recent() == []


def test_per_strategy_dry_run_spares_only_the_named_strategies(tmp_path: Path) -> None:
    audit = AuditLog(None)
    writer = CgroupWriter(
        v1_host(tmp_path), on_change=audit.on_write, dry_run_strategies=frozenset({"cpusuppress"})
    )
    writer.write(CPU_CFS_QUOTA, PODS[0], 20000, strategy="cpusuppress")
    writer.write(CPU_CFS_QUOTA, PODS[1], 30000, strategy="cpuburst")
    assert quota(tmp_path, PODS[0]) == "-1\n"
    assert quota(tmp_path, PODS[1]) == "30000"
    assert [(e.kind, e.strategy) for e in audit.recent()] == [
        ("write", "cpuburst"),
        ("decision", "cpusuppress"),
    ]


def test_the_same_dry_run_decision_is_audited_once_per_cache_lifetime(tmp_path: Path) -> None:
    audit = AuditLog(None)
    now = [100.0]
    writer = CgroupWriter(
        v1_host(tmp_path),
        on_change=audit.on_write,
        dry_run_all=True,
        cache_ttl=60.0,
        clock=lambda: now[0],
    )
    for _ in range(5):  # a dry-run strategy decides the same every round
        assert writer.write(CPU_CFS_QUOTA, PODS[0], 20000, strategy="s").dry_run
    writer.write(CPU_CFS_QUOTA, PODS[0], 30000, strategy="s")  # another decision
    now[0] += 61.0
    writer.write(CPU_CFS_QUOTA, PODS[0], 30000, strategy="s")  # the lifetime is over

    assert [e.new for e in audit.recent()] == ["30000", "30000", "20000"]  # newest first
    assert quota(tmp_path, PODS[0]) == "-1\n"


def test_a_dry_run_caches_nothing_so_a_later_real_write_is_done(tmp_path: Path) -> None:
    host = v1_host(tmp_path)
    writer = CgroupWriter(host, dry_run_all=True)
    writer.write(CPU_CFS_QUOTA, PODS[0], 20000, strategy="s")
    writer.dry_run_all = False
    assert writer.write(CPU_CFS_QUOTA, PODS[0], 20000, strategy="s").changed
    assert quota(tmp_path, PODS[0]) == "20000"


def test_a_new_writer_reads_every_file_before_its_first_write(tmp_path: Path) -> None:
    host = v1_host(tmp_path)
    CgroupWriter(host).write(CPU_CFS_QUOTA, PODS[0], 20000)
    (tmp_path / "cgroup/cpu" / PODS[0] / "cpu.cfs_quota_us").write_text("-1\n")  # behind our back
    restarted = CgroupWriter(host)
    assert restarted.write(CPU_CFS_QUOTA, PODS[0], 20000).changed
    assert quota(tmp_path, PODS[0]) == "20000"


def test_resync_drops_the_cache_so_a_value_changed_behind_our_back_is_restored(
    tmp_path: Path,
) -> None:
    writer = CgroupWriter(v1_host(tmp_path))
    writer.write(CPU_CFS_QUOTA, PODS[0], 20000)
    (tmp_path / "cgroup/cpu" / PODS[0] / "cpu.cfs_quota_us").write_text("-1\n")
    assert not writer.write(CPU_CFS_QUOTA, PODS[0], 20000).changed  # trusted from cache
    assert writer.resync() == 1
    assert writer.write(CPU_CFS_QUOTA, PODS[0], 20000).changed
    assert quota(tmp_path, PODS[0]) == "20000"


def test_every_file_write_is_timed_with_its_file_and_status(tmp_path: Path) -> None:
    seen: list[tuple[str, str]] = []
    writer = CgroupWriter(
        v1_host(tmp_path), observe=lambda kind, status, seconds: seen.append((kind, status))
    )
    writer.write(CPU_CFS_QUOTA, PODS[0], 20000)
    writer.write(CPU_CFS_QUOTA, PODS[0], 20000)  # unchanged: no file write, no sample
    writer.write(CPU_SHARES, PODS[1], 2)
    assert seen == [("cpu.cfs_quota_us", "success"), ("cpu.shares", "success")]


def test_stopping_finishes_the_running_batch_and_drops_the_queued_one(tmp_path: Path) -> None:
    host = v1_host(tmp_path)
    started, release = threading.Event(), threading.Event()

    def hold_after_first_change(result: WriteResult) -> None:
        if not started.is_set():
            started.set()
            release.wait(10)

    writer = CgroupWriter(host, on_change=hold_after_first_change)
    writer.start()
    running = writer.submit_batch([BatchWrite(CPU_CFS_QUOTA, p, 20000) for p in PODS])
    assert started.wait(10)
    queued = writer.submit_batch([BatchWrite(CPU_CFS_QUOTA, p, 40000) for p in PODS])
    stopper = threading.Thread(target=writer.stop, kwargs={"cancel_pending": True})
    stopper.start()
    release.set()
    stopper.join(10)
    assert running.result(timeout=1).changed == 2
    assert queued.cancelled()
    assert [quota(tmp_path, p) for p in PODS] == ["20000", "20000"]
