"""The one OSError translation: each errno lands on its branch of the koordlet's error tree.

Where this machine's kernel can produce the errno, the OSError is the kernel's own (opening a
missing file, writing a folder, writing a read-only procfs file); the rest are built with the
errno the kernel documents for the case (ENODEV on an open file of a removed cgroup: see
``kernfs_fop_read_iter``; EOPNOTSUPP from a PSI file with psi=0: ``psi_show``).
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from koordlet.errors import CgroupGoneError, HostError, UnsupportedError
from koordlet.system import oserrors


def kernel_error(action: str, path: str) -> OSError:
    """The OSError the kernel answers to ``action`` (read/write) on ``path``."""
    try:
        if action == "read":
            os.close(os.open(path, os.O_RDONLY))
        else:
            fd = os.open(path, os.O_WRONLY)
            try:
                os.write(fd, b"x")
            finally:
                os.close(fd)
    except OSError as err:
        return err
    raise AssertionError(f"{action} {path} succeeded")


def test_a_missing_file_read_is_a_cgroup_gone_race_chained_to_nothing_else(
    tmp_path: Path,
) -> None:
    path = str(tmp_path / "pod" / "memory.stat")
    err = kernel_error("read", path)

    translated = oserrors.read_error(path, err)

    assert type(translated) is CgroupGoneError
    assert path in str(translated)


@pytest.mark.parametrize("code", [errno.ENODEV, errno.ESRCH])
def test_reads_of_a_removed_cgroup_or_a_dead_process_are_gone(code: int) -> None:
    translated = oserrors.read_error("/proc/42/cgroup", OSError(code, os.strerror(code)))

    assert type(translated) is CgroupGoneError


def test_any_other_read_failure_is_a_plain_host_error_with_the_kernel_words(
    tmp_path: Path,
) -> None:
    err = kernel_error("write", str(tmp_path))  # a folder: EISDIR

    translated = oserrors.read_error(str(tmp_path), err)

    assert type(translated) is HostError
    assert os.strerror(errno.EISDIR) in str(translated)


def test_a_knob_file_absent_from_an_existing_cgroup_is_unsupported_naming_the_knob(
    tmp_path: Path,
) -> None:
    path = str(tmp_path / "cpu.cfs_burst_us")
    err = kernel_error("write", path)

    translated = oserrors.knob_error(path, err, "cpu_burst", "writing '1'")

    assert isinstance(translated, UnsupportedError)
    assert translated.what == "cpu_burst"
    assert path in translated.reason


def test_a_knob_file_of_a_removed_cgroup_is_gone_and_says_what_was_being_done(
    tmp_path: Path,
) -> None:
    path = str(tmp_path / "pod-gone" / "cpu.shares")
    err = kernel_error("write", path)

    translated = oserrors.knob_error(path, err, "cpu_shares", "writing '2'")

    assert type(translated) is CgroupGoneError
    assert "writing '2'" in str(translated)


def test_a_refused_knob_write_is_a_host_error_with_the_kernel_reason() -> None:
    path = "/proc/version"  # read-only procfs file: the kernel answers EACCES or EIO
    err = kernel_error("write", path)

    translated = oserrors.knob_error(path, err, "x", "writing 'y'")

    assert type(translated) is HostError
    assert str(translated) == f"{path}: writing 'y' failed: {err.strerror}"


def test_a_missing_system_setting_is_unsupported_with_what_the_kernel_needs(
    tmp_path: Path,
) -> None:
    path = str(tmp_path / "reap_background")
    err = kernel_error("read", path)

    translated = oserrors.system_file_error(path, err, "reap_background", "Anolis kernels")

    assert isinstance(translated, UnsupportedError)
    assert translated.reason == f"{path} absent (Anolis kernels)"


def test_an_absent_resctrl_group_is_gone_and_other_failures_host_errors(tmp_path: Path) -> None:
    missing = str(tmp_path / "LS" / "schemata")

    absent = oserrors.absent_error(missing, kernel_error("read", missing), "reading")
    refused = oserrors.absent_error(str(tmp_path), kernel_error("write", str(tmp_path)), "reading")

    assert type(absent) is CgroupGoneError
    assert type(refused) is HostError
    assert "reading failed" in str(refused)


def _refused_psi_read() -> None:
    try:
        os.close(os.open("/nonexistent-kpytest", os.O_RDONLY))
    except OSError as err:
        err.errno = errno.EOPNOTSUPP  # what psi_show answers when PSI is disabled at boot
        raise HostError("/proc/pressure/cpu: refused") from err


def test_a_refused_errno_is_found_through_the_chain_of_causes() -> None:
    with pytest.raises(HostError) as wrapped:
        _refused_psi_read()

    assert oserrors.refused_errno(wrapped.value) == errno.EOPNOTSUPP
    assert oserrors.errno_of(wrapped.value) == errno.EOPNOTSUPP
    assert oserrors.refused_errno(HostError("no cause")) is None
    assert oserrors.refused_errno(OSError(errno.EACCES, "denied")) is None


@pytest.mark.parametrize(
    ("code", "name"),
    [
        (errno.ENOENT, "ENOENT"),
        (errno.EOPNOTSUPP, "EOPNOTSUPP"),
        (999, "errno 999"),
        (None, "no errno"),
    ],
)
def test_errno_names_are_the_symbolic_ones(code: int | None, name: str) -> None:
    assert oserrors.errno_name(code) == name


def test_gone_on_writes_does_not_include_a_dead_process() -> None:
    dead = OSError(errno.ESRCH, "No such process")

    assert oserrors.is_gone(dead)
    assert not oserrors.is_gone(dead, reading=False)
    assert oserrors.is_gone(OSError(errno.ENODEV, "No such device"), reading=False)
