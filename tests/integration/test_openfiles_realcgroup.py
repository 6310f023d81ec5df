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


@pytest.fixture
def cgroups(cgroup: Path) -> Iterator[list[Path]]:
    """Three child cgroups of ``cgroup``, removed after the test (children first)."""
    children = [cgroup / f"c{n}" for n in range(3)]
    for child in children:
        child.mkdir()
    try:
        yield children
    finally:
        for child in children:
            if child.exists():
                child.rmdir()


def test_a_column_is_read_at_once_only_once_every_file_is_kept(cgroups: list[Path]) -> None:
    paths = tuple(str(c / "cpuacct.usage") for c in cgroups)
    files = OpenFiles(limit=10)
    before = own_fds()
    try:
        assert files.column(paths) is None  # nothing kept yet: read file by file
        assert own_fds() == before
        alone = [files.read(p) for p in paths]
        data = files.column(paths)

        assert data is not None
        assert [int(d) for d in data] == [int(d) for d in alone] == [0, 0, 0]  # no task ran
        assert own_fds() == before + 3  # the same descriptors, none opened for the column
        for _ in range(KEEP_TICKS + 2):  # read by column only: stamped, never pruned
            assert files.end_tick() == 0
            assert files.column(paths) is not None
        assert len(files) == 3
    finally:
        files.close()
    assert own_fds() == before


def test_a_column_is_closed_like_any_kept_file_when_no_longer_read(cgroups: list[Path]) -> None:
    paths = tuple(str(c / "cpuacct.usage") for c in cgroups)
    files = OpenFiles(limit=10)
    for p in paths:
        files.read(p)
    assert files.column(paths) is not None
    closed = [files.end_tick() for _ in range(KEEP_TICKS + 1)]

    assert closed == [0] * KEEP_TICKS + [3]
    assert len(files) == 0
    assert files.column(paths) is None


def kept_column(cgroups: list[Path]) -> tuple[tuple[str, ...], OpenFiles]:
    """The cgroups' ``cpuacct.usage`` files, each read once (so kept), and read as a column."""
    paths = tuple(str(c / "cpuacct.usage") for c in cgroups)
    files = OpenFiles(limit=10)
    try:
        for p in paths:
            files.read(p)
        assert files.column(paths) is not None
    except BaseException:
        files.close()
        raise
    return paths, files


def test_a_column_with_a_removed_cgroup_is_refused_and_never_reads_a_reused_descriptor(
    cgroups: list[Path], cgroup: Path
) -> None:
    paths, files = kept_column(cgroups)
    try:
        cgroups[1].rmdir()

        assert files.column(paths) is None  # the kept file reads ENODEV: file by file
        with pytest.raises(CgroupGoneError):
            files.read(paths[1])  # ... which names it and closes it
        assert len(files) == 2
        # The next file opened most likely gets the closed descriptor's number; the column,
        # resolved before the close, must not read it as cgroups[1]'s.
        other = str(cgroup / "cpuacct.stat")
        files.read(other)
        assert files.column(paths) is None  # paths[1] is no longer kept
        assert files.column((paths[0], paths[2])) is not None
    finally:
        files.close()


def test_a_columns_files_read_alone_stay_open_and_age_from_their_last_read(
    cgroups: list[Path],
) -> None:
    paths, files = kept_column(cgroups)
    try:
        files.end_tick()
        # The column is no longer asked for (say its collector reads file by file now): the
        # files read alone stay open however long ago the column was last read ...
        for _ in range(KEEP_TICKS + 2):
            for p in paths[:2]:
                files.read(p)
            files.end_tick()
        assert len(files) == 2  # ... and the one nobody reads is closed
        closed = [files.end_tick() for _ in range(KEEP_TICKS)]
        assert closed == [0] * (KEEP_TICKS - 1) + [2]
        assert len(files) == 0
    finally:
        files.close()
