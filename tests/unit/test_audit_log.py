"""The audit log: entries in the ring and in the rotated JSON-lines file, bounded on disk."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from koordlet.executor.audit import FILE_NAME, AuditLog
from koordlet.executor.writer import WriteResult


def lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_an_entry_reaches_the_file_as_one_json_line_with_every_field(tmp_path: Path) -> None:
    log = AuditLog(str(tmp_path / "audit"), clock=lambda: 1700000000.5)
    log.start()
    log.record(
        "evict",
        strategy="memoryevict",
        reason="node memory 82% >= 70%",
        path="kubepods/besteffort/pod1",
        old="default/be-1",
        detail={"release_bytes": 1024},
    )
    log.close()
    (entry,) = lines(tmp_path / "audit" / FILE_NAME)
    assert entry == {
        "ts": 1700000000.5,
        "kind": "evict",
        "strategy": "memoryevict",
        "reason": "node memory 82% >= 70%",
        "path": "kubepods/besteffort/pod1",
        "knob": "",
        "old": "default/be-1",
        "new": "",
        "dry_run": False,
        "detail": {"release_bytes": 1024},
    }
    assert log.stats()["written"] == 1


def test_a_changed_write_is_a_write_entry_and_a_dry_run_one_a_decision(tmp_path: Path) -> None:
    log = AuditLog(str(tmp_path))
    log.start()
    log.on_write(WriteResult("/c/cpu.shares", "1024", "2\n", True, "cpu_shares", "cpuqos", "BE"))
    log.on_write(
        WriteResult("/c/cpu.cfs_quota_us", "-1", "2000\n", False, "cpu_cfs_quota", "s", "r", True)
    )
    log.close()
    written, decided = lines(tmp_path / FILE_NAME)
    assert (written["kind"], written["old"], written["new"], written["dry_run"]) == (
        "write",
        "1024",
        "2",
        False,
    )
    assert (decided["kind"], decided["new"], decided["dry_run"]) == ("decision", "2000", True)


def test_recent_returns_the_newest_first_filtered_by_strategy_and_kind() -> None:
    log = AuditLog(None, ring=5)
    for i in range(7):
        log.record("write", strategy="a" if i % 2 else "b", new=str(i))
    log.record("decision", strategy="a", new="d", dry_run=True)
    assert [e.new for e in log.recent(100)] == ["d", "6", "5", "4", "3"]
    assert [e.new for e in log.recent(2, strategy="a")] == ["d", "5"]
    assert [e.new for e in log.recent(10, kind="write", strategy="a")] == ["5", "3"]


def test_the_file_rotates_and_never_exceeds_its_budget(tmp_path: Path) -> None:
    log = AuditLog(str(tmp_path), max_bytes=4096, backups=2)
    log.start()
    for i in range(400):
        log.record("write", strategy="cpusuppress", reason=f"round {i}", path="/x" * 20)
    log.close()
    names = sorted(os.listdir(tmp_path))
    assert names == [FILE_NAME, f"{FILE_NAME}.1", f"{FILE_NAME}.2"]
    sizes = [os.path.getsize(tmp_path / n) for n in names]
    assert all(size <= 4096 for size in sizes)
    newest = lines(tmp_path / FILE_NAME)
    assert newest[-1]["reason"] == "round 399"
    older = lines(tmp_path / f"{FILE_NAME}.1")
    assert older[-1]["reason"] == f"round {int(str(newest[0]['reason']).split()[1]) - 1}"


def test_a_restart_appends_to_the_file_and_keeps_rotating(tmp_path: Path) -> None:
    for run in range(2):
        log = AuditLog(str(tmp_path), max_bytes=2048, backups=1)
        log.start()
        for i in range(40):
            log.record("write", reason=f"run {run} entry {i}")
        log.close()
    assert sorted(os.listdir(tmp_path)) == [FILE_NAME, f"{FILE_NAME}.1"]
    assert lines(tmp_path / FILE_NAME)[-1]["reason"] == "run 1 entry 39"


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere")
def test_an_unwritable_directory_keeps_entries_in_memory_without_raising_as_user(
    tmp_path: Path,
) -> None:
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    log = AuditLog(str(locked / "audit"))
    log.start()
    log.record("write", reason="kept")
    log.close()
    assert log.errors >= 1
    assert [e.reason for e in log.recent()] == ["kept"]


def test_a_file_in_place_of_the_directory_is_counted_not_raised(tmp_path: Path) -> None:
    blocker = tmp_path / "audit"
    blocker.write_text("not a directory")
    log = AuditLog(str(blocker))
    log.start()
    log.record("write", reason="kept")
    log.close()
    assert log.errors >= 1
    assert (log.recorded, log.written, log.dropped) == (1, 0, 1)  # lost at close, and said so
    assert [e.reason for e in log.recent()] == ["kept"]


def test_entries_the_directory_refused_are_written_once_it_is_usable_without_a_new_one(
    tmp_path: Path,
) -> None:
    blocker = tmp_path / "audit"
    blocker.write_text("not a directory")
    log = AuditLog(str(blocker), retry_interval=0.02)
    log.start()
    try:
        log.record("write", reason="one")
        log.record("write", reason="two")
        deadline = time.monotonic() + 10
        while log.pending != 2 or not log.errors:
            assert time.monotonic() < deadline, "the entries were never held"
            time.sleep(0.01)
        assert log.written == 0
        first_errors = log.errors
        blocker.unlink()
        while log.pending:
            assert time.monotonic() < deadline, "the held entries were never written"
            time.sleep(0.01)
    finally:
        log.close()
    assert (log.recorded, log.written, log.dropped) == (2, 2, 0)
    assert log.errors >= first_errors
    assert [e["reason"] for e in lines(blocker / FILE_NAME)] == ["one", "two"]


def test_entries_recorded_before_start_or_after_close_stay_in_memory(tmp_path: Path) -> None:
    log = AuditLog(str(tmp_path))
    log.record("write", reason="early")
    log.start()
    log.close()
    log.record("write", reason="late")
    assert [e.reason for e in log.recent()] == ["late", "early"]
    assert log.dropped == 2
    assert not (tmp_path / FILE_NAME).exists()


def test_an_unknown_kind_is_refused() -> None:
    with pytest.raises(ValueError, match="audit kind"):
        AuditLog(None).record("delete")  # type: ignore[arg-type]
