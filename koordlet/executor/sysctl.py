"""Node-wide kernel settings (procfs ``sys/vm`` and Anolis sysfs files): validated, deduplicated,
audited writes, like :class:`~koordlet.executor.writer.CgroupWriter` does for cgroup knobs.

Each :class:`SystemFile` is declared once, as the knob table declares a cgroup knob: its file,
its codec (the file's text ↔ the value, :mod:`koordlet.system.knobcodecs`) and its valid range
(Koordinator's validators in ``pkg/koordlet/util/system/system_file.go``)::

    MIN_FREE_KBYTES          <proc>/sys/vm/min_free_kbytes                  int 10240..10485760 (kB)
    WATERMARK_SCALE_FACTOR   <proc>/sys/vm/watermark_scale_factor           int 10..400
    MEMCG_REAP_BACKGROUND    <sys>/kernel/mm/memcg_reaper/reap_background   int 0..1 (Anolis)

Callers pass these objects (``writer.write(MIN_FREE_KBYTES, 90000)``), never a name; only what
was persisted by name (the originals journal) is looked up with :func:`system_file`.

:meth:`SystemFileWriter.write` validates the value (out of range: ``InvalidValueError``, nothing
written), reads the file, writes only when the value differs, and hands every change to
``on_change`` as a :class:`~koordlet.executor.writer.WriteResult` (the audit log's hook, the same
as the cgroup writer's). A file that does not exist is ``UnsupportedError`` naming it.

Writes run on the executor's writer thread through :func:`call_on_writer` when the executor offers
a public hook for it (``CgroupWriter.call``); until then on a worker thread, serialized by a lock
of this module, so that two node-wide writes never interleave.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Awaitable, Callable, Mapping
from types import MappingProxyType
from typing import Any, TypeVar

from apis.records import frozen
from koordlet.errors import InvalidValueError, ParseError, UnsupportedError
from koordlet.executor.originals import Original, Recorder
from koordlet.executor.writer import WriteResult
from koordlet.system.knobcodecs import IntCodec, Range
from koordlet.system.oserrors import host_file_error, system_file_error
from koordlet.system.paths import HostPaths

logger = logging.getLogger(__name__)

T = TypeVar("T")

_LOCK = threading.Lock()
"""Serializes the writes of this module and of ``koordlet.executor.resctrl`` while they run
off the cgroup writer's thread."""


def call_on_writer(executor: object, fn: Callable[[], T]) -> Awaitable[T]:
    """Run ``fn`` on the executor's single writer thread and await its result.

    Uses the executor's public ``call(fn) -> concurrent.futures.Future`` when it has one; without
    it, a worker thread holding this module's lock (node-wide files are never written by the
    cgroup writer, so the two cannot race on a file).
    """
    call = getattr(executor, "call", None)
    if callable(call):
        return asyncio.wrap_future(call(fn))

    def locked() -> T:
        with _LOCK:
            return fn()

    return asyncio.to_thread(locked)


INT_CODEC = IntCodec()
"""A decimal integer file."""


@frozen
class SystemFile:
    """One node-wide kernel setting: a row of the sysctl table."""

    name: str
    """Logical name, the key in :data:`SYSTEM_FILES` and in the audit log and the originals
    journal (``vm.min_free_kbytes``)."""
    root: str
    """``proc`` or ``sys``: which injected root the path is under."""
    parts: tuple[str, ...]
    """Path below that root."""
    valid: Range
    """Valid values (Koordinator's validator)."""
    doc: str
    """What it does, in one line."""
    requires: str = ""
    """What a kernel needs to have the file; shown when it is absent."""
    codec: IntCodec = INT_CODEC
    """The file's text ↔ the value (a decimal integer for every setting so far)."""

    def path(self, paths: HostPaths) -> str:
        """The file on this host."""
        return paths.proc(*self.parts) if self.root == "proc" else paths.sys(*self.parts)


# fmt: off
MIN_FREE_KBYTES = SystemFile(
    "vm.min_free_kbytes", "proc", ("sys", "vm", "min_free_kbytes"), Range(10 * 1024, 10 << 20),
    "free memory (kB) the kernel keeps for atomic allocations; the base of the zone watermarks")
WATERMARK_SCALE_FACTOR = SystemFile(
    "vm.watermark_scale_factor", "proc", ("sys", "vm", "watermark_scale_factor"), Range(10, 400),
    "gap between the zone watermarks in 1/10000 of memory: how early kswapd starts reclaiming")
MEMCG_REAP_BACKGROUND = SystemFile(
    "memcg_reap_background", "sys", ("kernel", "mm", "memcg_reaper", "reap_background"),
    Range(0, 1), "Anolis background memcg reaper", requires="Anolis kernels only")
# fmt: on
SYSTEM_FILES: Mapping[str, SystemFile] = MappingProxyType(
    {f.name: f for f in (MIN_FREE_KBYTES, WATERMARK_SCALE_FACTOR, MEMCG_REAP_BACKGROUND)}
)
"""Every node-wide setting the executor may write, by name (for what was persisted by name)."""


def system_file(name: str) -> SystemFile:
    """The setting called ``name`` (a name read back from the originals journal);
    ``UnsupportedError`` for an unknown name."""
    try:
        return SYSTEM_FILES[name]
    except KeyError:
        raise UnsupportedError(name, "no such setting in koordlet.executor.sysctl") from None


class SystemFileWriter:
    """Reads and writes the settings of :data:`SYSTEM_FILES` (call it on the writer thread)."""

    def __init__(
        self,
        paths: HostPaths,
        *,
        on_change: Callable[[WriteResult], None] | None = None,
        is_dry_run: Callable[[str], bool] | None = None,
        record_original: Recorder | None = None,
    ) -> None:
        self.paths = paths
        """Host roots the files resolve under."""
        self.on_change = on_change
        """Called with every result that changed a file, and every dry-run result that would
        have (the audit log)."""
        self.is_dry_run = is_dry_run or (lambda strategy: False)
        """Whether writes asked for by a strategy are only computed and audited (the cgroup
        writer's rule)."""
        self.record_original = record_original
        """Called before a setting is changed with its value (the originals journal)."""

    def probe(self, f: SystemFile) -> tuple[bool, str]:
        """``(supported, reason)``: whether the file exists and is readable and writable."""
        path = f.path(self.paths)
        if not os.path.exists(path):
            why = f" ({f.requires})" if f.requires else ""
            return False, f"{path} absent{why}"
        if not os.access(path, os.R_OK | os.W_OK):
            return False, f"permission denied on {path} (read-only procfs/sysfs?)"
        return True, f"found at {path}"

    def read(self, f: SystemFile) -> int:
        """The current value; ``UnsupportedError`` when absent, ``ParseError`` when the text does
        not decode."""
        path = f.path(self.paths)
        text = self._read(path, f)
        try:
            return f.codec.decode(text)
        except ValueError as err:
            raise ParseError(f"{path}: {err}: {text[:40]!r}") from None

    def write(
        self, f: SystemFile, value: int, *, strategy: str = "", reason: str = ""
    ) -> WriteResult:
        """Set ``f`` to ``value`` when it differs; see the module docstring."""
        name = f.name
        try:
            canonical = f.valid.normalize(value)
        except (TypeError, ValueError) as err:
            raise InvalidValueError(
                f"{name}: invalid value {value!r} (valid: {f.valid.describe()}): {err}"
            ) from err
        path = f.path(self.paths)
        current = self.read(f)
        new = f.codec.encode(canonical, None)
        if current == canonical:
            return WriteResult(path, new, new, False, name, strategy, reason)
        if self.is_dry_run(strategy):
            logger.info("dry run: would write %s: %s -> %s (%s)", path, current, new, reason)
            dry = WriteResult(path, str(current), new, False, name, strategy, reason, True)
            notify(self.on_change, dry)
            return dry
        result = WriteResult(path, str(current), new, True, name, strategy, reason)
        record(self.record_original, Original("sysctl", path, name, str(current)))
        self._write(path, new)
        logger.info("wrote %s: %s -> %s (%s)", path, current, new, reason or strategy)
        notify(self.on_change, result)
        return result

    def restore(
        self, f: SystemFile, text: str, *, strategy: str = "", reason: str = ""
    ) -> WriteResult:
        """Write ``text``, a value this setting held before (``koordlet reset``), without the
        range check (the kernel's own earlier value is valid to it); audited, dry run as the
        rule says. ``ParseError`` when ``text`` does not decode."""
        name = f.name
        path = f.path(self.paths)
        try:
            value = f.codec.decode(text)
        except ValueError as err:
            raise ParseError(f"{path}: recorded value: {err}: {text[:40]!r}") from None
        current = self.read(f)
        new = f.codec.encode(value, None)
        if current == value:
            return WriteResult(path, str(current), new, False, name, strategy, reason)
        if self.is_dry_run(strategy):
            dry = WriteResult(path, str(current), new, False, name, strategy, reason, True)
            notify(self.on_change, dry)
            return dry
        self._write(path, new)
        result = WriteResult(path, str(current), new, True, name, strategy, reason)
        notify(self.on_change, result)
        return result

    @staticmethod
    def _write(path: str, text: str) -> None:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_TRUNC | os.O_CLOEXEC)
            try:
                os.write(fd, text.encode("ascii"))
            finally:
                os.close(fd)
        except OSError as err:
            raise host_file_error(path, err, f"writing {text!r}") from err

    @staticmethod
    def _read(path: str, f: SystemFile) -> str:
        try:
            with open(path, encoding="ascii", errors="replace") as fh:
                return fh.read()
        except OSError as err:
            raise system_file_error(path, err, f.name, f.requires) from err


def record(hook: Recorder | None, original: Original) -> None:
    """Hand ``original`` to the originals journal; a broken journal never stops a write."""
    if hook is None:
        return
    try:
        hook(original)
    except Exception:
        logger.exception("recording the original of %s failed", original.path)


def notify(hook: Callable[[WriteResult], None] | None, result: WriteResult) -> None:
    """Hand ``result`` to the audit hook; a broken hook never fails a done write."""
    if hook is None:
        return
    try:
        hook(result)
    except Exception:
        logger.exception("on_change hook failed for %s", result.path)


def executor_hooks(executor: object) -> dict[str, Any]:
    """The audit hook, dry-run rule and originals journal of the cgroup executor, for the
    node-wide writers to share: ``{"on_change": ..., "is_dry_run": ..., "record_original":
    ...}`` (None where the executor has none)."""
    hooks = {}
    for name in ("on_change", "is_dry_run", "record_original"):
        hook = getattr(executor, name, None)
        hooks[name] = hook if callable(hook) else None
    return hooks
