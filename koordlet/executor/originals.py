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
- **Durable enough, atomic.** Each new entry is one appended JSON line, written and flushed
  before the file it describes is touched (a torn last line, from a crash mid-append, is
  ignored when loading); a rewrite (:meth:`OriginalsJournal.forget`, the start-up clean-up) goes
  to a temporary file that replaces the journal in one ``rename``. No ``fsync``: what it protects
  is kernel state, which a power loss resets anyway (the boot id changes).

The file is ``<state-dir>/originals.jsonl``: a header line ``{"version": 1, "bootId": ...}``,
then one :class:`Original` per line. The writers that record: the cgroup writer (``cgroup``),
``executor.sysctl`` (``sysctl``), ``executor.resctrl`` (``resctrl_group``, ``resctrl_schemata``),
``executor.tc`` (``tc_tree``) and ``executor.ownedfile`` (``owned_file``).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from typing import Any, Literal

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


@dataclass(frozen=True, slots=True)
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
        if doc.get("kind") not in KINDS:
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
        self.discarded_stale = 0
        """Entries dropped at load because they were written in another boot."""
        self.errors = 0
        """Appends that failed (logged once); the write they preceded went on."""
        self._stale_lines = 0

    # Reading -------------------------------------------------------------------------------------

    def load(self) -> OriginalsJournal:
        """Read the file (none: empty). A journal of another boot is emptied. Returns self."""
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        try:
            with open(self.path, encoding="utf-8") as f:
                lines = f.read().splitlines()
        except FileNotFoundError:
            return self
        header: dict[str, Any] = {}
        if lines:
            try:
                header = json.loads(lines[0])
            except ValueError:
                header = {}
        entries = [e for e in map(_parse, lines[1:]) if e is not None]
        if not isinstance(header, dict) or header.get("bootId") != self.boot_id:
            kept = [e for e in entries if e.kind in PERSISTENT_KINDS]
            self.discarded_stale = len(entries) - len(kept)
            if self.discarded_stale:
                logger.info(
                    "%s: %d originals of another boot discarded (a reboot restored them)",
                    self.path,
                    self.discarded_stale,
                )
            with self._lock:
                for entry in kept:
                    self._entries.setdefault(entry.key, entry)
                self._rewrite(self._entries)
            return self
        with self._lock:
            for entry in entries:
                self._entries.setdefault(entry.key, entry)
        return self

    def entries(self) -> list[Original]:
        """Every entry, in the order recorded."""
        with self._lock:
            return list(self._entries.values())

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    # Writing -------------------------------------------------------------------------------------

    def record(self, entry: Original) -> bool:
        """Append ``entry`` unless its path and knob are known; True when it was added. An I/O
        error is logged (once) and counted; the caller's write goes on."""
        with self._lock:
            if entry.key in self._entries:
                return False
            if not entry.at:
                entry = Original(
                    entry.kind, entry.path, entry.knob, entry.text, entry.rel_dir, self._clock()
                )
            self._entries[entry.key] = entry
            try:
                new_file = not os.path.exists(self.path)
                with open(self.path, "a", encoding="utf-8") as f:
                    if new_file:
                        f.write(self._header())
                    f.write(json.dumps(asdict(entry), separators=(",", ":")) + "\n")
            except OSError as err:
                self.errors += 1
                if self.errors == 1:
                    logger.warning("cannot record originals in %s: %s", self.path, err)
            return True

    def forget(self, keys: Iterable[tuple[str, str]], *, lazy: bool = False) -> int:
        """Drop the entries of ``keys`` (put back, or gone) and rewrite the file without them;
        how many. ``lazy`` (a removed pod's cgroups, whose files are gone anyway): rewrite only
        once :data:`COMPACT_AFTER` entries were dropped so."""
        with self._lock:
            gone = [k for k in keys if self._entries.pop(k, None) is not None]
            self._stale_lines += len(gone)
            if gone and (not lazy or self._stale_lines >= COMPACT_AFTER):
                self._rewrite(self._entries)
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

    def _rewrite(self, entries: dict[tuple[str, str], Original]) -> None:
        tmp = f"{self.path}.tmp"
        try:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            with open(tmp, "w", encoding="utf-8") as f:
                f.write(self._header())
                for entry in entries.values():
                    f.write(json.dumps(asdict(entry), separators=(",", ":")) + "\n")
            os.replace(tmp, self.path)
            self._stale_lines = 0
        except OSError as err:
            self.errors += 1
            logger.warning("cannot rewrite %s: %s", self.path, err)
