"""The native column reader (``koordlet/system/_colread.c`` through
``koordlet.system.nativeread``): for every file it accepts, the Python parser's values; it
declines everything else, and names the failing file's index and ``errno``.

Contents are generated in the kernel's exact layouts (with hypothesis), then mutated a byte at a
time, and written to real files read through real descriptors; real cgroup files are read too.
"""

from __future__ import annotations

import errno
import os
import shutil
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from koordlet.collectors.runner import CollectorRunner
from koordlet.metriccache import MetricCache
from koordlet.statesinformer.model import WorkloadSnapshot
from koordlet.system import nativeread
from koordlet.system.cgroupstats import (
    PAGE_SIZE,
    READ_BUFFER,
    parse_cpu_throttling,
    parse_integer,
    parse_memory_lru_v1,
)
from koordlet.system.nativeread import (
    CPU_THROTTLING_V1,
    INTEGER,
    MEMORY_LRU_V1,
    ColumnFailure,
    NativeFormat,
    NativeReader,
    Prepared,
)

PYTHON_PARSERS = {
    INTEGER.name: parse_integer,
    CPU_THROTTLING_V1.name: parse_cpu_throttling,
    MEMORY_LRU_V1.name: parse_memory_lru_v1,
}
FORMATS = (INTEGER, CPU_THROTTLING_V1, MEMORY_LRU_V1)
MAX_VALUE = 10**18 - 1  # 18 digits: the most the library reads


def compiler() -> str | None:
    return shutil.which("cc") or shutil.which("gcc")


@pytest.fixture(scope="module")
def native() -> NativeReader:
    reader, why = nativeread.load()
    if reader is None:
        if compiler() is not None and os.environ.get(nativeread.ENV) is None:
            pytest.fail(f"a C compiler is here but the native reader is not: {why}")
        pytest.skip(f"native column reader {why}")
    return reader


class Files:
    """Contents written to files of a temporary folder, opened for reading."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.fds: list[int] = []

    def open(self, contents: Sequence[bytes]) -> list[int]:
        fds = []
        for data in contents:
            path = self.folder / uuid.uuid4().hex
            path.write_bytes(data)
            fds.append(os.open(path, os.O_RDONLY))
        self.fds.extend(fds)
        return fds

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds.clear()


@pytest.fixture
def files(tmp_path: Path) -> Iterator[Files]:
    made = Files(tmp_path)
    try:
        yield made
    finally:
        made.close()


def native_values(
    native: NativeReader, files: Files, fmt: NativeFormat, contents: Sequence[bytes]
) -> list[Any]:
    fds = files.open(contents)
    try:
        return native.read(Prepared(fds, fmt.width), fmt)
    finally:
        for fd in fds:
            os.close(fd)
            files.fds.remove(fd)


def python_values(fmt: NativeFormat, contents: Sequence[bytes]) -> list[Any]:
    parse = PYTHON_PARSERS[fmt.name]
    return [parse(data, f"file{i}") for i, data in enumerate(contents)]


# The kernel's layouts ------------------------------------------------------------------------

values = st.integers(min_value=0, max_value=MAX_VALUE)


@st.composite
def cpuacct_usage(draw: st.DrawFn) -> bytes:
    return b"%d\n" % draw(values)


@st.composite
def cpu_stat_v1(draw: st.DrawFn) -> bytes:
    periods, throttled, time_ns = draw(values), draw(values), draw(values)
    text = b"nr_periods %d\nnr_throttled %d\nthrottled_time %d\n" % (periods, throttled, time_ns)
    if draw(st.booleans()):  # 5.14+
        text += b"nr_bursts %d\nburst_time %d\n" % (draw(values), draw(values))
    return text


@st.composite
def numa_stat_v1(draw: st.DrawFn) -> bytes:
    nodes = draw(st.integers(min_value=1, max_value=8))
    pages = st.integers(min_value=0, max_value=10**12)
    lines = []
    for prefix in (b"", b"hierarchical_"):
        for name in (b"total", b"file", b"anon", b"unevictable"):
            per_node = [draw(pages) for _ in range(nodes)]
            fields = b"".join(b" N%d=%d" % (n, v) for n, v in enumerate(per_node))
            lines.append(b"%s%s=%d%s\n" % (prefix, name, sum(per_node), fields))
    return b"".join(lines)


LAYOUTS = {INTEGER.name: cpuacct_usage(), CPU_THROTTLING_V1.name: cpu_stat_v1()}
LAYOUTS[MEMORY_LRU_V1.name] = numa_stat_v1()
FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_a_column_in_the_kernels_layout_reads_as_the_python_parser_reads_it(
    native: NativeReader, tmp_path: Path, fmt: NativeFormat
) -> None:
    @FAST
    @given(st.lists(LAYOUTS[fmt.name], min_size=1, max_size=12))
    def check(contents: list[bytes]) -> None:
        made = Files(tmp_path)
        try:
            assert native_values(native, made, fmt, contents) == python_values(fmt, contents)
        finally:
            made.close()

    check()


def mutate(data: bytes, where: int, how: int, byte: int) -> bytes:
    """One byte of ``data`` replaced, inserted or deleted."""
    at = where % (len(data) + 1)
    if how == 0 and at < len(data):
        return data[:at] + bytes([byte]) + data[at + 1 :]
    if how == 1:
        return data[:at] + bytes([byte]) + data[at:]
    return data[:at] + data[at + 1 :]


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_a_file_off_the_layout_is_declined_or_read_as_the_python_parser_reads_it(
    native: NativeReader, tmp_path: Path, fmt: NativeFormat
) -> None:
    """Never a value the Python parser would not give: a mutated file is either still in the
    layout (a digit for a digit) and reads the same, or stops the column at its index."""
    interesting = st.sampled_from(b"0123456789 =\nN_-+x\t\x00")

    @settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(
        LAYOUTS[fmt.name],
        LAYOUTS[fmt.name],
        st.integers(min_value=0, max_value=4096),
        st.integers(min_value=0, max_value=2),
        interesting | st.integers(min_value=0, max_value=255),
    )
    def check(good: bytes, other: bytes, where: int, how: int, byte: int) -> None:
        bad = mutate(other, where, how, byte)
        made = Files(tmp_path)
        stopped: tuple[int, int] | None = None
        try:
            got = native_values(native, made, fmt, [good, bad])
        except ColumnFailure as failure:
            stopped = (failure.index, failure.errno)
        finally:
            made.close()
        if stopped is None:
            assert got == python_values(fmt, [good, bad])
        else:
            assert stopped == (1, 0)

    check()


@pytest.mark.parametrize(
    ("fmt", "data"),
    [
        (INTEGER, b"1234567890123456789\n"),  # 19 digits
        (INTEGER, b"12"),  # no newline
        (INTEGER, b"12\n\n"),
        (INTEGER, b" 12\n"),
        (INTEGER, b"-12\n"),
        (INTEGER, b"\n"),
        (INTEGER, b""),
        (CPU_THROTTLING_V1, b"nr_periods 1\nnr_throttled 0\n"),  # throttled_time missing
        (CPU_THROTTLING_V1, b"nr_throttled 0\nnr_periods 1\nthrottled_time 0\n"),
        (CPU_THROTTLING_V1, b"nr_periods 1\nnr_throttled 0\nthrottled_time 0\nwait_sum 5\n"),
        (CPU_THROTTLING_V1, b"usage_usec 5\nuser_usec 3\nsystem_usec 2\n"),  # v2
        (MEMORY_LRU_V1, b"total=1 N0=1\nfile=0 N0=0\nanon=1 N0=1\n"),  # cut short
        (MEMORY_LRU_V1, b"hierarchical_file=1\nhierarchical_anon=2\nhierarchical_unevictable=3\n"),
    ],
)
def test_what_the_kernel_never_writes_is_left_to_the_python_parser(
    native: NativeReader, files: Files, fmt: NativeFormat, data: bytes
) -> None:
    good = next(iter(python_sample(fmt)))
    with pytest.raises(ColumnFailure) as failure:
        native_values(native, files, fmt, [good, data])
    assert (failure.value.index, failure.value.errno) == (1, 0)


def python_sample(fmt: NativeFormat) -> list[bytes]:
    return {
        INTEGER.name: [b"0\n"],
        CPU_THROTTLING_V1.name: [b"nr_periods 3\nnr_throttled 1\nthrottled_time 9\n"],
        MEMORY_LRU_V1.name: [
            b"total=7 N0=7\nfile=1 N0=1\nanon=2 N0=2\nunevictable=4 N0=4\n"
            b"hierarchical_total=70 N0=70\nhierarchical_file=10 N0=10\n"
            b"hierarchical_anon=20 N0=20\nhierarchical_unevictable=40 N0=40\n"
        ],
    }[fmt.name]


def test_the_memory_values_are_bytes_of_the_hierarchical_lines(
    native: NativeReader, files: Files
) -> None:
    (lru,) = native_values(native, files, MEMORY_LRU_V1, python_sample(MEMORY_LRU_V1))
    assert (lru.anon, lru.unevictable, lru.file) == (20 * PAGE_SIZE, 40 * PAGE_SIZE, 10 * PAGE_SIZE)


def test_a_file_that_fills_the_buffer_is_left_to_the_python_path(
    native: NativeReader, files: Files
) -> None:
    padded = b"0" * (READ_BUFFER - 2) + b"7\n"  # a valid integer of READ_BUFFER bytes
    with pytest.raises(ColumnFailure) as failure:
        native_values(native, files, INTEGER, [b"1\n", padded])
    assert (failure.value.index, failure.value.errno) == (1, 0)


def test_a_failed_read_names_the_file_and_its_errno(native: NativeReader, files: Files) -> None:
    fds = files.open([b"1\n", b"2\n"])
    closed = fds[1]
    os.close(closed)
    files.fds.remove(closed)
    with pytest.raises(ColumnFailure) as failure:
        native.read(Prepared(fds, 1), INTEGER)
    assert (failure.value.index, failure.value.errno) == (1, errno.EBADF)


def test_a_column_read_with_another_width_is_refused(native: NativeReader, files: Files) -> None:
    fds = files.open([b"1\n"])
    with pytest.raises(ValueError, match="prepared for 1 values a file"):
        native.read(Prepared(fds, 1), MEMORY_LRU_V1)


@pytest.mark.parametrize(
    "fmt",
    [
        NativeFormat("wrong width", INTEGER.kind, 3, list),  # out would be 3x the C's writes
        NativeFormat("too narrow", MEMORY_LRU_V1.kind, 1, list),  # out would overflow
        NativeFormat("unknown kind", 7, 1, list),
    ],
    ids=lambda f: f.name,
)
def test_a_width_or_kind_the_library_does_not_know_is_refused_before_any_read(
    native: NativeReader, files: Files, fmt: NativeFormat
) -> None:
    prepared = Prepared(files.open([b"1\n"]), fmt.width)
    with pytest.raises(ColumnFailure) as failure:
        native.read(prepared, fmt)
    assert (failure.value.index, failure.value.errno) == (0, errno.EINVAL)
    assert list(prepared.out) == [0] * fmt.width  # nothing written


def test_the_prepared_arrays_are_reused_with_fresh_values(
    native: NativeReader, tmp_path: Path
) -> None:
    path = tmp_path / "usage"
    path.write_bytes(b"5\n")
    fd = os.open(path, os.O_RDONLY)
    try:
        prepared = Prepared([fd, fd], 1)
        assert native.read(prepared, INTEGER) == [5, 5]
        path.write_bytes(b"6\n")
        assert native.read(prepared, INTEGER) == [6, 6]  # pread at offset 0, every time
    finally:
        os.close(fd)


# Loading -------------------------------------------------------------------------------------


def test_the_library_is_built_where_a_compiler_is() -> None:
    if compiler() is None:
        pytest.skip("no C compiler (cc, gcc): the package installs without the native reader")
    assert nativeread.library_path() is not None, "setup.py's optional extension did not build"


@pytest.mark.parametrize("value", ["off", "0", "false", "NO"])
def test_the_environment_turns_it_off(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv(nativeread.ENV, value)
    reader, why = nativeread.load()
    assert reader is None
    assert why == f"off: {nativeread.ENV}={value}"


def test_an_installation_without_the_library_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(nativeread.ENV, raising=False)
    monkeypatch.setattr(nativeread, "library_path", lambda: None)
    reader, why = nativeread.load()
    assert reader is None
    assert why.startswith(f"off: {nativeread.LIBRARY_FILE} was not built")


def test_a_library_that_does_not_load_says_which_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    broken = tmp_path / "_colread.so"
    broken.write_text("not a shared object\n")
    monkeypatch.delenv(nativeread.ENV, raising=False)
    monkeypatch.setattr(nativeread, "library_path", lambda: str(broken))
    reader, why = nativeread.load()
    assert reader is None
    assert why.startswith(f"off: {broken} does not load:")


# Real kernel files ---------------------------------------------------------------------------

V1 = {
    INTEGER.name: ("cpuacct", "cpuacct.usage"),
    CPU_THROTTLING_V1.name: ("cpu", "cpu.stat"),
    MEMORY_LRU_V1.name: ("memory", "memory.numa_stat"),
}


@pytest.mark.realcgroup
@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_real_cgroup_files_read_as_the_python_parser_reads_them(
    native: NativeReader, fmt: NativeFormat
) -> None:
    """Empty cgroups of this machine's v1 hierarchy (their counters stand still) and the
    controller's root (whose counters move: read twice, around the native read)."""
    controller, name = V1[fmt.name]
    root = Path("/sys/fs/cgroup", controller)
    if os.geteuid() != 0 or not (root / name).is_file():
        pytest.skip(f"needs root and the cgroup v1 {controller} controller with {name}")
    made = [root / f"kpytest-{uuid.uuid4().hex[:12]}" for _ in range(3)]
    fds: list[int] = []
    try:
        for folder in made:
            folder.mkdir()
        fds = [os.open(folder / name, os.O_RDONLY) for folder in made]
        got = native.read(Prepared(fds, fmt.width), fmt)
        assert got == python_values(fmt, [os.pread(fd, READ_BUFFER, 0) for fd in fds])
        # A removed cgroup's kept file: the read fails with ENODEV, at its index.
        os.rmdir(made[2])
        with pytest.raises(ColumnFailure) as failure:
            native.read(Prepared(fds, fmt.width), fmt)
        assert (failure.value.index, failure.value.errno) == (2, errno.ENODEV)
    finally:
        for fd in fds:
            os.close(fd)
        for folder in made:
            if folder.exists():
                folder.rmdir()


def test_the_runner_reads_its_kept_columns_with_the_reader_it_is_given(
    native: NativeReader,
) -> None:
    def runner(**kwargs: Any) -> CollectorRunner:
        return CollectorRunner([], MetricCache(), lambda: WorkloadSnapshot(), **kwargs)

    loaded = runner(keep_open=10)._open_files
    assert loaded is not None
    assert loaded.native is not None
    assert loaded.native.path == native.path
    unasked = runner(keep_open=10, native=False)._open_files
    assert unasked is not None
    assert unasked.native is None
    assert runner(keep_open=0)._open_files is None  # nothing kept: nothing read natively
