"""The watches the kernel holds on an inotify instance, from its own account of them."""

from __future__ import annotations


def kernel_watches(fd: int) -> set[int]:
    """The watch descriptors of inotify instance ``fd`` (of this process), as
    ``/proc/self/fdinfo/<fd>`` lists them: one ``inotify wd:%x ino:%lx ...`` line each, the
    descriptor in hex (the kernel's fs/notify/fdinfo.c)."""
    with open(f"/proc/self/fdinfo/{fd}") as f:
        return {int(ln.split()[1][3:], 16) for ln in f if ln.startswith("inotify wd:")}
