"""Folder watches (koordlet.system.inotify) on real folders with the kernel's inotify; the real
cgroup folders are in tests/integration/test_collectors_realcgroup.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from koordlet.errors import UnsupportedError
from koordlet.system import inotify
from koordlet.system.inotify import DirWatcher
from tests.inotifywatches import kernel_watches


def test_child_folders_made_removed_or_renamed_mark_their_parent(tmp_path: Path) -> None:
    watcher = DirWatcher()
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    wd_a, wd_b = watcher.add(str(a)), watcher.add(str(b))
    assert watcher.changes().changed == set()  # nothing yet: one read, EAGAIN

    (a / "pod1").mkdir()
    assert watcher.changes().changed == {wd_a}
    (a / "pod1").rename(b / "pod1")
    assert watcher.changes().changed == {wd_a, wd_b}
    (b / "pod1").rmdir()
    assert watcher.changes().changed == {wd_b}
    watcher.close()


def test_files_are_not_events_and_a_removed_folder_reports_its_watch_gone(
    tmp_path: Path,
) -> None:
    watcher = DirWatcher()
    pod = tmp_path / "pod"
    pod.mkdir()
    wd = watcher.add(str(pod))
    (pod / "cpu.shares").write_text("2\n")  # the kernel's own files: no pod changed

    assert not watcher.changes()
    (pod / "cpu.shares").unlink()
    pod.rmdir()
    changes = watcher.changes()
    assert changes.gone == {wd}
    assert changes.changed == set()
    watcher.close()


def test_a_folder_renamed_away_reports_its_watch_gone_and_is_no_longer_watched(
    tmp_path: Path,
) -> None:
    watcher = DirWatcher()
    qos = tmp_path / "burstable"
    (qos / "pod").mkdir(parents=True)
    parent, wd = watcher.add(str(qos)), watcher.add(str(qos / "pod"))

    (qos / "pod").rename(qos / "pod.old")
    changes = watcher.changes()

    assert changes.gone == {wd}
    assert changes.changed == {parent}
    assert kernel_watches(watcher.fd) == {parent}
    (qos / "pod.old" / "c1").mkdir()  # under the moved folder: nothing reported any more
    assert not watcher.changes().changed
    watcher.close()


def test_a_folder_watched_twice_has_one_watch_and_a_missing_one_none(tmp_path: Path) -> None:
    watcher = DirWatcher()
    first = watcher.add(str(tmp_path))

    assert watcher.add(str(tmp_path)) == first
    assert watcher.add(str(tmp_path / "gone")) is None
    watcher.close()


def test_closing_releases_the_descriptor_once(tmp_path: Path) -> None:
    before = len(os.listdir("/proc/self/fd"))
    watcher = DirWatcher()
    assert len(os.listdir("/proc/self/fd")) == before + 1

    watcher.close()
    watcher.close()

    assert watcher.closed
    assert len(os.listdir("/proc/self/fd")) == before


def test_a_collected_watcher_closes_its_descriptor() -> None:
    before = len(os.listdir("/proc/self/fd"))
    DirWatcher()  # dropped at once

    assert len(os.listdir("/proc/self/fd")) == before


def test_no_instance_left_is_unsupported_with_the_sysctl_named(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class NoInstances:
        def inotify_init1(self, flags: int) -> int:
            import ctypes
            import errno

            ctypes.set_errno(errno.EMFILE)
            return -1

    monkeypatch.setattr(inotify, "_libc", lambda: NoInstances())
    with pytest.raises(UnsupportedError, match="max_user_instances"):
        DirWatcher()


def test_no_watch_left_is_unsupported_with_the_sysctl_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    watcher = DirWatcher()

    class NoWatches:
        def inotify_add_watch(self, fd: int, path: bytes, mask: int) -> int:
            import ctypes
            import errno

            ctypes.set_errno(errno.ENOSPC)
            return -1

    monkeypatch.setattr(watcher, "_libc", NoWatches())
    with pytest.raises(UnsupportedError, match="max_user_watches"):
        watcher.add(str(tmp_path))
    watcher.close()


def test_the_probe_watches_a_folder_and_names_the_limit(tmp_path: Path) -> None:
    before = len(os.listdir("/proc/self/fd"))

    supported, reason, path = inotify.probe_inotify(str(tmp_path))

    assert (supported, path) == (True, str(tmp_path))
    assert "fs.inotify.max_user_watches=" in reason
    assert len(os.listdir("/proc/self/fd")) == before  # closed again


def test_the_probe_says_why_not_and_what_the_walker_does_instead(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_instance() -> DirWatcher:
        raise UnsupportedError(
            "inotify", "no inotify instance left (fs.inotify.max_user_instances)"
        )

    monkeypatch.setattr(inotify, "DirWatcher", no_instance)
    supported, reason, _ = inotify.probe_inotify(str(tmp_path))

    assert not supported
    assert "max_user_instances" in reason
    assert "lists the pod folders instead" in reason
