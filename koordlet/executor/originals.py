"""The originals journal: what each file held before this koordlet first wrote it.

``koordlet reset`` (docs/baremetal.md, "Reset and uninstall") puts back what the koordlet wrote;
for that the writers (:class:`~koordlet.executor.writer.CgroupWriter`, the node-wide
:class:`~koordlet.executor.sysctl.SystemFileWriter` and
:class:`~koordlet.executor.resctrl.ResctrlWriter`) hand an :class:`Original` to
:meth:`OriginalsJournal.record` on their one writer thread *before* they change a file (or create
a resctrl group) for the first time: the knob and the file's text as found.

Rules:

- **The first value wins.** An entry already in the journal is never replaced, also not by a
  later koordlet: after a restart the file holds what the previous run wrote, and the original is
  the one recorded before that run's first write. Values are kept across restarts (LS pods stay
  protected during an upgrade); only ``reset`` puts them back.
- **One boot.** Cgroups and sysctls do not survive a reboot, so neither do the originals: the
  journal carries the kernel's ``boot_id``, and one written in another boot is discarded when
  loaded; but for the kinds of :data:`PERSISTENT_KINDS` (files on disk, which a reboot keeps).
- **Durable enough, atomic.** Each new entry is one appended JSON line
  (:class:`~koordlet.executor.appendfile.LineFile`: whole lines or nothing, a torn tail cut off
  before the next append and at load, never glued to), written before the file it describes is
  touched; a rewrite (:meth:`OriginalsJournal.forget`, the start-up clean-up) goes to a
  temporary file that replaces the journal in one ``rename``. No ``fsync``: what it protects is
  kernel state, which a power loss resets anyway (the boot id changes).
- **Nothing lost that can be kept.** An entry the disk refuses (``ENOSPC``, a read-only state
  directory) is kept in memory, the write it precedes goes on (protection never waits for the
  disk), and :meth:`OriginalsJournal.retry` (the daemon calls it every collect interval) writes
  the entries held, the header first when the file is empty, as soon as the disk takes them. A
  failure is logged once per distinct error, with the count of failed attempts when it clears;
  ``errors``, ``pending`` and ``last_error`` say where it stands (``koordlet_state_*``,
  ``/readyz``, ``koordlet status``: :mod:`koordlet.executor.statefiles`).

The file is ``<state-dir>/originals.jsonl``: a header line ``{"version": 1, "bootId": ...}``,
then one :class:`Original` per line. The writers that record: the cgroup writer (``cgroup``),
``executor.sysctl`` (``sysctl``), ``executor.resctrl`` (``resctrl_group``, ``resctrl_schemata``),
``executor.tc`` (``tc_tree``) and ``executor.ownedfile`` (``owned_file``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict
from typing import Any, Literal

from apis.records import frozen
from koordlet.executor.appendfile import LineFile

logger = logging.getLogger(__name__)

COMPACT_AFTER = 256
"""Entries forgotten lazily (removed pods) before the file is rewritten without them."""
FILE_NAME = "originals.jsonl"
"""The journal's file name in the state directory."""
VERSION = 1
"""Format version in the header line."""

Kind = Literal["cgroup", "sysctl", "resctrl_group", "resctrl_schemata", "tc_tree", "owned_file"]
KINDS: tuple[Kind, ...] = (
    "cgroup", "sysctl", "resctrl_group", "resctrl_schemata", "tc_tree", "owned_file"
)  # fmt: skip
PERSISTENT_KINDS: frozenset[str] = frozenset({"owned_file"})
"""Kinds whose entries outlive a reboot: the file they name is on disk, not in the kernel."""


@frozen
class Original:
    """A file (or resctrl group) as it was before this koordlet first changed it."""

    kind: Kind
    """``cgroup`` (a knob of a cgroup), ``sysctl`` (a node-wide setting of
    ``executor.sysctl``), ``resctrl_group`` (a control group the koordlet created) or
    ``resctrl_schemata`` (the ``schemata`` of a group it did not create), ``tc_tree`` (the
    network QoS HTB tree it installed on an interface in place of the kernel's default) or
    ``owned_file`` (a whole file it writes for another daemon, Terway's; ``reset`` removes it)."""
    path: str
    """The file written (the group's folder for ``resctrl_group``; ``tc:<interface>`` for
    ``tc_tree``)."""
    knob: str
    """The knob's logical name, the setting's name, or ``resctrl``."""
    text: str
    """The file's text before the first write, stripped (empty for a created group)."""
    rel_dir: str = ""
    """For a cgroup knob: the cgroup relative to its controller's root (``kubepods/besteffort``)."""
    at: float = 0.0
    """When it was recorded (wall-clock seconds)."""

    @property
    def key(self) -> tuple[str, str]:
        """What identifies it: the path and the knob."""
        return (self.path, self.knob)


Recorder = Callable[[Original], object]
"""The hook the writers call before a first write: :meth:`OriginalsJournal.record`."""


def read_boot_id(proc_root: str = "/proc") -> str:
    """The kernel's boot id (``<proc>/sys/kernel/random/boot_id``); empty when unreadable."""
    try:
        with open(os.path.join(proc_root, "sys", "kernel", "random", "boot_id")) as f:
            return f.read().strip()
    except OSError:
        return ""


def _parse(line: str) -> Original | None:
    try:
        doc = json.loads(line)
        if not isinstance(doc, dict) or doc.get("kind") not in KINDS:
            return None
        return Original(
            kind=doc["kind"],
            path=str(doc["path"]),
            knob=str(doc["knob"]),
            text=str(doc.get("text", "")),
            rel_dir=str(doc.get("rel_dir", "")),
            at=float(doc.get("at", 0.0)),
        )
    except (ValueError, TypeError, KeyError, AttributeError):
        return None


def _parse_line(line: str) -> tuple[Original | None, bool]:
    """An entry of one line, and whether it had to be cut out of a longer line: an older
    koordlet appended after a torn line, gluing the next entry to it (an entry is one flat JSON
    object, so the last ``{`` of the line starts it)."""
    entry = _parse(line)
    if entry is not None:
        return entry, False
    start = line.rfind("{")
    if start > 0:
        entry = _parse(line[start:])
        if entry is not None:
            return entry, True
    return None, False


def _line(entry: Original) -> str:
    return json.dumps(asdict(entry), separators=(",", ":")) + "\n"


class OriginalsJournal:
    """The journal of one state directory; thread-safe."""

    def __init__(
        self, state_dir: str, *, boot_id: str, clock: Callable[[], float] = time.time
    ) -> None:
        self.path = os.path.join(state_dir, FILE_NAME)
        """The journal file."""
        self.boot_id = boot_id
        """This boot's id; entries of another boot are discarded."""
        self._clock = clock
        self._lock = threading.Lock()
        self._entries: dict[tuple[str, str], Original] = {}
        self._file = LineFile(self.path)
        self._pending: list[Original] = []
        self._rewrite_due = False
        self._unread = False
        self.discarded_stale = 0
        """Entries dropped at load because they were written in another boot."""
        self.unreadable_lines = 0
        """Lines skipped at load (neither an entry nor an entry glued to a torn line)."""
        self.errors = 0
        """Attempts to write the file that failed (each held entry is tried again)."""
        self.last_error = ""
        """What the last failed attempt said; empty once the file took everything."""
        self._failing_since = 0
        self._stale_lines = 0

    # Reading -------------------------------------------------------------------------------------

    def load(self) -> OriginalsJournal:
        """Read the file (none: empty), cutting a torn tail. A journal of another boot is
        emptied. Returns self. A state directory it cannot create or a file it cannot read is
        counted and logged: the journal starts empty, holds what it records, and reads the file
        again before it writes it."""
        with self._lock:
            try:
                os.makedirs(os.path.dirname(self.path), exist_ok=True)
                self._merge_file()
            except OSError as err:
                self._unread = True  # never write over a file not read
                self._failed(err, "reading")
                return self
            if not self._rewrite_due:
                try:
                    if self._file.repair():
                        logger.info("%s: a torn last line was cut off", self.path)
                except OSError as err:
                    self._failed(err, "repairing")
            self._flush_locked()
        return self

    def _merge_file(self) -> None:
        """Read the file into the entries (its values first: they are older), under the lock.
        Sets a rewrite due when the file is of another boot or had entries glued together."""
        try:
            with open(self.path, encoding="utf-8", errors="replace") as f:
                lines = f.read().splitlines()
        except FileNotFoundError:
            lines = []
        self._unread = False
        header: Any = {}
        if lines:
            try:
                header = json.loads(lines[0])
            except ValueError:
                header = {}
        entries: list[Original] = []
        glued = unreadable = 0
        for line in lines[1:]:
            entry, was_glued = _parse_line(line)
            if entry is None:
                unreadable += 1
                continue
            glued += was_glued
            entries.append(entry)
        self.unreadable_lines += unreadable
        if unreadable or glued:
            logger.warning(
                "%s: %d unreadable lines skipped, %d entries recovered from lines glued to a "
                "torn one",
                self.path,
                unreadable,
                glued,
            )
        if lines and not (isinstance(header, dict) and header.get("bootId") == self.boot_id):
            kept = [e for e in entries if e.kind in PERSISTENT_KINDS]
            self.discarded_stale = len(entries) - len(kept)
            if self.discarded_stale:
                logger.info(
                    "%s: %d originals of another boot discarded (a reboot restored them)",
                    self.path,
                    self.discarded_stale,
                )
            entries = kept
            self._rewrite_due = True
        elif glued:
            self._rewrite_due = True  # one entry a line again
        held = self._entries
        self._entries = {}
        for entry in entries:
            self._entries.setdefault(entry.key, entry)
        for key, entry in held.items():  # recorded while the file could not be read
            if key not in self._entries:
                self._entries[key] = entry
            elif not self._rewrite_due:
                self._pending = [e for e in self._pending if e.key != key]
        if held and self._rewrite_due:
            self._pending.clear()

    def entries(self) -> list[Original]:
        """Every entry, in the order recorded."""
        with self._lock:
            return list(self._entries.values())

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    @property
    def pending(self) -> int:
        """Entries recorded but not yet in the file (the disk refused them)."""
        with self._lock:
            return len(self._pending) + (len(self._entries) if self._rewrite_due else 0)

    @property
    def needs_retry(self) -> bool:
        """Whether :meth:`retry` has something to write."""
        with self._lock:
            return bool(self._pending) or self._rewrite_due or self._unread

    def stats(self) -> dict[str, Any]:
        """Where the file stands, JSON-ready (``/debug``, ``koordlet status``)."""
        with self._lock:
            return {
                "file": self.path,
                "entries": len(self._entries),
                "pending": len(self._pending) + (len(self._entries) if self._rewrite_due else 0),
                "errors": self.errors,
                "last_error": self.last_error,
                "repaired_tails": self._file.repaired,
                "unreadable_lines": self.unreadable_lines,
            }

    # Writing -------------------------------------------------------------------------------------

    def record(self, entry: Original) -> bool:
        """Append ``entry`` unless its path and knob are known; True when it was added. When
        the disk refuses it, it is held in memory (see the module docstring); the caller's
        write goes on either way."""
        with self._lock:
            if entry.key in self._entries:
                return False
            if not entry.at:
                entry = Original(
                    entry.kind, entry.path, entry.knob, entry.text, entry.rel_dir, self._clock()
                )
            self._entries[entry.key] = entry
            if not self._rewrite_due:
                self._pending.append(entry)
            self._flush_locked()
            return True

    def retry(self) -> bool:
        """Write what the disk refused before; True when nothing is left held."""
        with self._lock:
            if self._pending or self._rewrite_due or self._unread:
                self._flush_locked()
            return not (self._pending or self._rewrite_due or self._unread)

    def forget(self, keys: Iterable[tuple[str, str]], *, lazy: bool = False) -> int:
        """Drop the entries of ``keys`` (put back, or gone) and rewrite the file without them;
        how many. ``lazy`` (a removed pod's cgroups, whose files are gone anyway): rewrite only
        once :data:`COMPACT_AFTER` entries were dropped so."""
        with self._lock:
            gone = [k for k in keys if self._entries.pop(k, None) is not None]
            if not gone:
                return 0
            gone_set = set(gone)
            self._pending = [e for e in self._pending if e.key not in gone_set]
            self._stale_lines += len(gone)
            if not lazy or self._stale_lines >= COMPACT_AFTER:
                self._rewrite_due = True
                self._flush_locked()
            return len(gone)

    def forget_cgroups(self, rel_dirs: Iterable[str]) -> int:
        """Drop, lazily, the cgroup entries of ``rel_dirs`` and their descendants (removed
        pods: their files are gone with them)."""
        dirs = {d.strip("/") for d in rel_dirs}
        bases = tuple(d + "/" for d in dirs)
        with self._lock:
            keys = [
                k
                for k, e in self._entries.items()
                if e.kind == "cgroup" and (e.rel_dir in dirs or e.rel_dir.startswith(bases))
            ]
        return self.forget(keys, lazy=True) if keys else 0

    def prune_missing(self) -> int:
        """Drop the entries whose file (or group folder) no longer exists."""
        with self._lock:
            keys = [k for k in self._entries if not os.path.exists(k[0])]
        return self.forget(keys)

    def _header(self) -> str:
        return json.dumps({"version": VERSION, "bootId": self.boot_id}) + "\n"

    def _flush_locked(self) -> None:
        """Write what is held: the whole journal when a rewrite is due, else the pending entries
        appended (the header first into an empty file). Under the lock."""
        try:
            if self._unread:
                self._merge_file()
            if self._rewrite_due:
                self._rewrite()
                self._rewrite_due = False
                self._stale_lines = 0
            elif self._pending:
                data = "".join(_line(e) for e in self._pending)
                self._file.append(data.encode(), first=self._header().encode())
        except OSError as err:
            self._failed(err, "writing")
            return
        self._pending.clear()
        if self._failing_since:
            logger.info(
                "%s: written again after %d failed attempts; nothing held in memory",
                self.path,
                self._failing_since,
            )
        self._failing_since = 0
        self.last_error = ""

    def _rewrite(self) -> None:
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        tmp = f"{self.path}.tmp"
        try:
            with open(tmp, "w", encoding="utf-8") as f:
                f.write(self._header())
                for entry in self._entries.values():
                    f.write(_line(entry))
            os.replace(tmp, self.path)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        self._file.forget_size()

    def _failed(self, err: OSError, doing: str) -> None:
        self.errors += 1
        self._failing_since += 1
        text = f"{doing}: {err.strerror or err}"
        if text != self.last_error:
            logger.warning(
                "cannot record originals in %s (%s); %d entries held in memory, written once "
                "the disk takes them",
                self.path,
                text,
                len(self._pending) + (len(self._entries) if self._rewrite_due else 0),
            )
        else:
            logger.debug("%s still failing: %s", self.path, text)
        self.last_error = text
