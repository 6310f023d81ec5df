"""Kernel files kept open between ticks (``koordlet.system.openfiles``) on this machine's real
cgroup v1 hierarchy: fresh content at every read, a removed cgroup reported gone and its file
closed, regular files never kept."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from koordlet.errors import CgroupGoneError
from koordlet.system.openfiles import KEEP_TICKS, OpenFiles

pytestmark = pytest.mark.realcgroup
CPUACCT = Path("/sys/fs/cgroup/cpuacct")


@pytest.fixture
def cgroup() -> Iterator[Path]:
    if os.geteuid() != 0 or not (CPUACCT / "cgroup.procs").exists():
        pytest.skip("needs root and the cgroup v1 cpuacct controller")
    path = CPUACCT / f"kpytest-{uuid.uuid4().hex[:12]}"
    path.mkdir()
    try:
        yield path
    finally:
        if path.exists():
            for pid in (path / "cgroup.procs").read_text().split():
                (CPUACCT / "cgroup.procs").write_text(pid)
            path.rmdir()


def own_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_a_kept_file_is_read_afresh_and_stays_open(cgroup: Path) -> None:
    files = OpenFiles(limit=10)
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        (cgroup / "cgroup.procs").write_text(str(busy.pid))
        first = int(files.read(str(cgroup / "cpuacct.usage")))
        time.sleep(0.3)
        second = int(files.read(str(cgroup / "cpuacct.usage")))
    finally:
        busy.kill()
        busy.wait()
        files.close()

    assert second > first
    assert len(files) == 0  # closed


def test_a_removed_cgroup_reads_as_gone_and_its_file_is_closed(cgroup: Path) -> None:
    files = OpenFiles(limit=10)
    before = own_fds()
    files.read(str(cgroup / "cpuacct.usage"))
    assert (len(files), own_fds()) == (1, before + 1)

    cgroup.rmdir()  # the kernel lets it go although the file is open
    with pytest.raises(CgroupGoneError):
        files.read(str(cgroup / "cpuacct.usage"))

    assert (len(files), own_fds()) == (0, before)


def test_files_not_read_for_a_while_are_closed_at_tick_end(cgroup: Path) -> None:
    files = OpenFiles(limit=10)
    files.read(str(cgroup / "cpuacct.usage"))
    closed = [files.end_tick() for _ in range(KEEP_TICKS + 1)]  # the tick it was read, then more

    assert closed == [0] * KEEP_TICKS + [1]
    assert len(files) == 0


def test_regular_files_and_files_over_the_limit_are_not_kept(cgroup: Path, tmp_path: Path) -> None:
    regular = tmp_path / "cpuacct.usage"
    regular.write_text("5\n")
    files = OpenFiles(limit=1)
    try:
        assert files.read(str(regular)) == b"5\n"
        regular.write_text("6\n")
        assert files.read(str(regular)) == b"6\n"
        files.read(str(cgroup / "cpuacct.usage"))
        files.read(str(cgroup / "cpuacct.stat"))
        assert len(files) == 0  # the limit is taken by the regular file's marker
    finally:
        files.close()
    files = OpenFiles(limit=0)
    files.read(str(cgroup / "cpuacct.usage"))
    assert len(files) == 0
