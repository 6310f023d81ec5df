"""The originals journal and the audit log on a real small tmpfs that fills up and frees, or turns
read-only: what the disk refuses is held, written header first once it has room (also with no
new record), never torn, and counted truthfully (``tests/statedisk.py`` mounts it)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path

import pytest

from koordlet.executor.audit import FILE_NAME as AUDIT_FILE
from koordlet.executor.audit import AuditLog
from koordlet.executor.originals import FILE_NAME, Original, OriginalsJournal
from koordlet.executor.statefiles import StateFiles
from tests.statedisk import fill, free, remount, small_tmpfs

BOOT = "8a1e5c0e-2222-4c3b-9b7d-000000000025"
PAGE = 4096


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Path]:
    with small_tmpfs(tmp_path / "statefs") as mount:
        yield mount


def journal(state: Path) -> OriginalsJournal:
    return OriginalsJournal(str(state), boot_id=BOOT, clock=lambda: 1000.0).load()


def entry(name: str, text: str = "-1") -> Original:
    return Original("cgroup", f"/cg/kp/be/{name}/cpu.cfs_quota_us", "cpu_cfs_quota", text, "kp/be")


def wait_for(what: str, check: Callable[[], bool], within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"no {what} within {within:g}s")
        time.sleep(0.02)


def file_lines(path: Path) -> list[str]:
    data = path.read_bytes()
    assert data == b"" or data.endswith(b"\n"), f"{path} ends with a torn line: {data[-80:]!r}"
    return data.decode().splitlines()


def test_originals_a_full_disk_refuses_are_written_header_first_once_it_has_room(
    disk: Path,
) -> None:
    state = disk / "state"
    j = journal(state)
    fill(disk)

    for name in ("pod-a", "pod-b", "pod-c"):
        assert j.record(entry(name))  # the cgroup write it precedes goes on

    assert j.pending == 3
    assert j.errors >= 1
    assert "No space left on device" in j.stats()["last_error"]
    path = state / FILE_NAME
    assert not path.exists() or file_lines(path) == []
    assert StateFiles(j, None).problems()  # what /readyz and koordlet status show

    free(disk)
    assert j.retry()  # no new record needed

    lines = file_lines(path)
    assert json.loads(lines[0]) == {"version": 1, "bootId": BOOT}
    assert [json.loads(line)["path"].split("/")[4] for line in lines[1:]] == [
        "pod-a",
        "pod-b",
        "pod-c",
    ]
    again = journal(state)  # the next start: the same boot, nothing discarded
    assert len(again) == 3
    assert again.discarded_stale == 0
    assert j.pending == 0
    assert j.stats()["last_error"] == ""
    assert StateFiles(j, None).problems() == []


def line_size(e: Original) -> int:
    """Bytes of ``e``'s line in the journal (one compact JSON object and a newline)."""
    return len(json.dumps(asdict(e), separators=(",", ":"))) + 1


def test_an_append_cut_short_by_a_full_disk_is_cut_back_and_never_glued_to(disk: Path) -> None:
    state = disk / "state"
    j = journal(state)
    j.record(entry("first"))
    path = state / FILE_NAME
    # grow the file to 40 bytes short of a page: the next line starts in the last free bytes
    # of an allocated page and needs a page the full disk does not have
    pad = Original("cgroup", "/cg/kp/be/pad/cpu.shares", "cpu_shares", "", "kp/be", 1000.0)
    fit = PAGE - 40 - path.stat().st_size - line_size(pad)
    j.record(Original(pad.kind, pad.path, pad.knob, "x" * fit, pad.rel_dir))
    assert path.stat().st_size == PAGE - 40
    fill(disk)

    assert j.record(entry("torn", text="y" * 200))  # 40 bytes fit, then ENOSPC

    assert path.stat().st_size == PAGE - 40  # cut back: no half line
    assert len(file_lines(path)) == 3
    assert j.pending == 1
    free(disk)
    j.record(entry("after"))
    names = [json.loads(line)["path"].split("/")[4] for line in file_lines(path)[1:]]
    assert names == ["first", "pad", "torn", "after"]


def test_the_audit_log_holds_what_a_full_disk_refuses_and_its_counters_tell_the_truth(
    disk: Path,
) -> None:
    log = AuditLog(str(disk / "audit"), retry_interval=0.05)
    log.start()
    try:
        log.record("write", reason="before", detail={"pad": "x" * 3900})  # its page nearly full
        wait_for("the first entry on disk", lambda: log.written == 1)
        fill(disk)
        for i in range(20):
            log.record("write", reason=f"full {i}", path=f"/cg/pod{i}/cpu.shares", new="2")
        wait_for("20 entries held", lambda: log.pending == 20 and log.errors >= 1)

        assert (log.recorded, log.written, log.dropped) == (21, 1, 0)
        assert "No space left on device" in log.stats()["last_error"]
        assert len(file_lines(disk / "audit" / AUDIT_FILE)) == 1
        errors = log.errors
        wait_for("a retry while nothing new is recorded", lambda: log.errors > errors)

        free(disk)
        wait_for("the held entries written", lambda: log.pending == 0)
    finally:
        log.close()

    assert (log.recorded, log.written, log.dropped) == (21, 21, 0)
    assert log.stats()["last_error"] == ""
    reasons = [json.loads(line)["reason"] for line in file_lines(disk / "audit" / AUDIT_FILE)]
    assert reasons == ["before", *(f"full {i}" for i in range(20))]


def test_a_state_dir_turned_read_only_holds_records_until_it_is_writable_again(
    disk: Path,
) -> None:
    state = disk / "state"
    j = journal(state)
    j.record(entry("rw"))
    log = AuditLog(str(state / "audit"), retry_interval=0.05)
    log.start()
    files = StateFiles(j, log)
    try:
        remount(disk, read_only=True)
        try:
            assert j.record(entry("ro"))
            log.record("write", reason="while read-only")
            wait_for("the audit entry held", lambda: log.pending == 1)
            problems = files.problems()
            assert len(problems) == 2
            assert all("Read-only file system" in p for p in problems)
            assert j.pending == 1
            assert not files.retry()
        finally:
            remount(disk, read_only=False)
        assert files.retry()
        wait_for("the audit entry written", lambda: log.pending == 0)
        assert files.problems() == []
    finally:
        log.close()
    assert [e.path.split("/")[4] for e in journal(state).entries()] == ["rw", "ro"]
    assert len(file_lines(state / "audit" / AUDIT_FILE)) == 1
    assert sorted(os.listdir(state)) == ["audit", FILE_NAME]  # no temporary file left behind
