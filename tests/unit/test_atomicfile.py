"""``koordlet.system.atomicfile.write_atomic`` on a real disk and on a real full tmpfs."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

import pytest

from koordlet.system import atomicfile
from koordlet.system.atomicfile import write_atomic
from tests.statedisk import fill, small_tmpfs


def test_the_file_is_replaced_whole_with_mode_0600(tmp_path: Path) -> None:
    target = tmp_path / "state.json"
    target.write_bytes(b"old")
    write_atomic(str(target), b"new" * 100_000, prefix=".state-")
    assert target.read_bytes() == b"new" * 100_000
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert os.listdir(tmp_path) == ["state.json"]


def test_a_name_left_by_a_dead_writer_is_skipped(tmp_path: Path) -> None:
    following = next(atomicfile._counter) + 1
    left = tmp_path / f".state-{os.getpid()}-{following}.tmp"
    left.write_bytes(b"left by a crash")
    write_atomic(str(tmp_path / "state"), b"data", prefix=".state-")
    assert (tmp_path / "state").read_bytes() == b"data"
    assert left.read_bytes() == b"left by a crash"
    assert sorted(os.listdir(tmp_path)) == sorted(["state", left.name])


def test_a_full_disk_keeps_the_old_file_and_leaves_nothing(tmp_path: Path) -> None:
    with small_tmpfs(tmp_path / "disk") as disk:
        target = disk / "state"
        target.write_bytes(b"old")
        fill(disk)
        with pytest.raises(OSError) as caught:
            write_atomic(str(target), b"x" * 200_000, prefix=".state-")
        assert caught.value.errno == errno.ENOSPC
        assert target.read_bytes() == b"old"
        assert not [n for n in os.listdir(disk) if n.startswith(".state-")]


def test_the_mode_is_the_callers_less_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        write_atomic(str(tmp_path / "claim.json"), b"{}", prefix=".claim-", mode=0o666)
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "claim.json").stat().st_mode) == 0o644
