"""Per-process kernel settings (``/proc/<pid>/...``) of the processes in a cgroup: validated,
audited, dry-run writes, like :mod:`koordlet.executor.sysctl` does for node-wide files.

Each :class:`ProcessFile` is declared once with its valid range::

    oom_score_adj   <proc>/<pid>/oom_score_adj   -1000..1000

:meth:`ProcessFileWriter.apply` reads the cgroup's ``cgroup.procs`` (the processes, not the
threads: the setting belongs to the process), and for each pid reads the file and writes the value
only where it differs. A process that exits between the two reads is no error: ``ENOENT``/
``ESRCH`` count it as ``gone``. Each change goes to ``on_change`` as a
:class:`~koordlet.executor.writer.WriteResult` (the audit log's hook). In dry run nothing is
written and each decision is audited once a minute at most (a decision repeated every round is
not news). Call on the executor's writer thread
(:func:`~koordlet.executor.sysctl.call_on_writer`).

The originals journal is not fed: processes are transient, and upstream does not put a runtime's
value back either when the annotation goes (``koordlet reset`` leaves ``oom_score_adj`` alone).
"""

from __future__ import annotations

import errno
import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from apis.records import frozen
from koordlet.errors import InvalidValueError, UnsupportedError
from koordlet.executor.sysctl import notify
from koordlet.executor.writer import WriteResult
from koordlet.system.cgroups import CgroupLayout
from koordlet.system.knobcodecs import Range
from koordlet.system.paths import HostPaths

logger = logging.getLogger(__name__)

GONE = frozenset({errno.ENOENT, errno.ESRCH})
"""A pid that exited (its ``/proc/<pid>`` folder went away, or the task is dead)."""
DRY_RUN_REPEAT = 60.0
"""Seconds before the same dry-run decision on the same file is audited again."""
PROCS_CONTROLLER = "cpu"
"""The v1 hierarchy whose ``cgroup.procs`` lists a container's processes (every kubelet-made
hierarchy has the same ones; v2 has one)."""


@frozen
class ProcessFile:
    """One per-process setting."""

    name: str
    """Logical name, the key in :data:`PROCESS_FILES`."""
    filename: str
    """The file in ``/proc/<pid>/``."""
    valid: Range
    """Valid values."""
    doc: str
    """What it does, in one line."""


OOM_SCORE_ADJ = ProcessFile(
    "oom_score_adj",
    "oom_score_adj",
    Range(-1000, 1000),
    "added to the badness the OOM killer ranks processes by; -1000 never, 1000 first",
)
PROCESS_FILES: Mapping[str, ProcessFile] = MappingProxyType({OOM_SCORE_ADJ.name: OOM_SCORE_ADJ})
"""Every per-process setting the executor may write, by name."""


@dataclass(slots=True)
class ProcessResult:
    """What :meth:`ProcessFileWriter.apply` did in one cgroup."""

    updated: int = 0
    """Processes whose file was written (or, in dry run, would have been)."""
    unchanged: int = 0
    """Processes that had the value already."""
    gone: int = 0
    """Processes that exited while we looked."""
    failed: list[str] = field(default_factory=list)
    """Why a process's file could not be written (permission, a kernel refusal)."""
    cgroup_gone: bool = False
    """The cgroup itself was gone."""


class ProcessFileWriter:
    """Writes :data:`PROCESS_FILES` for the processes of a cgroup (see the module docstring)."""

    def __init__(
        self,
        paths: HostPaths,
        *,
        on_change: Callable[[WriteResult], None] | None = None,
        is_dry_run: Callable[[str], bool] | None = None,
        record_original: object = None,  # accepted with the other executor hooks; not fed
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.paths = paths
        self.on_change = on_change
        self.is_dry_run = is_dry_run or (lambda strategy: False)
        self._clock = clock
        self._dry: dict[tuple[str, str], float] = {}

    def apply(
        self,
        f: ProcessFile,
        layout: CgroupLayout,
        rel_dir: str,
        value: int,
        *,
        strategy: str = "",
        reason: str = "",
    ) -> ProcessResult:
        """Set ``f`` to ``value`` for every process of cgroup ``rel_dir``."""
        try:
            target = f.valid.normalize(value)
        except (TypeError, ValueError) as err:
            raise InvalidValueError(
                f"{f.name}: invalid value {value!r} (valid: {f.valid.describe()}): {err}"
            ) from err
        out = ProcessResult()
        procs = layout.file(PROCS_CONTROLLER, rel_dir, "cgroup.procs")
        try:
            with open(procs, "rb") as fh:
                pids = [int(p) for p in fh.read().split()]
        except FileNotFoundError:
            out.cgroup_gone = True
            return out
        except OSError as err:
            raise UnsupportedError(f.name, f"cannot read {procs}: {err.strerror}") from err
        dry = self.is_dry_run(strategy)
        new = str(target)
        for pid in pids:
            path = self.paths.proc(str(pid), f.filename)
            try:
                with open(path, "rb") as fh:
                    old = fh.read().decode("ascii", "replace").strip()
                if old == new:
                    out.unchanged += 1
                    continue
                if dry:
                    out.updated += 1
                    self._audit_dry(
                        WriteResult(path, old, new, False, f.name, strategy, reason, True)
                    )
                    continue
                fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
                try:
                    os.write(fd, new.encode("ascii"))
                finally:
                    os.close(fd)
            except OSError as err:
                if err.errno in GONE:
                    out.gone += 1
                else:
                    out.failed.append(f"{path}: {err.strerror}")
                continue
            out.updated += 1
            notify(self.on_change, WriteResult(path, old, new, True, f.name, strategy, reason))
        if out.updated and not dry:
            logger.info(
                "%s=%s on %d processes of %s (%s)", f.name, new, out.updated, rel_dir, reason
            )
        return out

    def _audit_dry(self, result: WriteResult) -> None:
        key = (result.path, result.new)
        now = self._clock()
        last = self._dry.get(key)
        if last is not None and now - last < DRY_RUN_REPEAT:
            return
        if len(self._dry) > 10_000:  # pids are recycled: keep the memo bounded
            self._dry.clear()
        self._dry[key] = now
        logger.info("dry run: would write %s: %s -> %s", result.path, result.old, result.new)
        notify(self.on_change, result)
