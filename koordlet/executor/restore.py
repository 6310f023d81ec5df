"""What ``koordlet reset`` puts back, and putting it back through the writers (so it is audited).

The plan (:func:`plan`) comes from the originals journal (:mod:`koordlet.executor.originals`)
plus the best-effort QoS cgroup, which is reset whether or not the journal knows it (a koordlet
of an older version, or Koordinator's, may have throttled it):

========================  ===================================================================
what                      put back to
========================  ===================================================================
BE QoS cgroup CFS quota   unlimited (``-1``; v2 ``max``), the kernel's value for a new cgroup
any QoS-level CFS quota   unlimited (the kubelet sets none on ``kubepods``, burstable, BE)
``cpuset.cpus``           the parent's ``cpuset.cpus`` (v2: an empty parent reads as inherit)
QoS knobs                 the kernel's defaults: ``cpu.cfs_burst_us`` 0, ``cpu.idle`` 0,
                          ``cpu.bvt_warp_ns`` 0, ``memory.min``/``memory.low`` 0,
                          ``memory.high`` max, ``memory.wmark_ratio`` 0,
                          ``memory.wmark_scale_factor`` 50, ``memory.wmark_min_adj`` 0,
                          ``memory.priority`` 0, ``memory.use_priority_oom`` 0,
                          ``memory.oom.group`` 0
other cgroup knobs        the value recorded before the first write (a pod's shares, quota or
                          memory limit as the kubelet set them)
sysctls                   the value recorded before the first write (no range check: it was
                          the kernel's)
resctrl                   a group the koordlet made is removed (its threads return to the
                          default group); a ``schemata`` line of a group it found is put back
network QoS tree          removed (the kernel puts its default root qdisc back)
owned files               removed: Terway's ``global_bps_config`` and ``pod.json``, whose only
                          writer is the koordlet (the folder stays: terway-qos watches it)
========================  ===================================================================

Cgroups whose folder is gone are skipped. Steps run parents first, so a widened parent
``cpuset`` admits its children's. :func:`apply` performs the plan through a
:class:`~koordlet.executor.writer.CgroupWriter` and a
:class:`~koordlet.executor.sysctl.SystemFileWriter` built with the audit log's hook and the dry
run of the command, and removes what was put back from the journal.
"""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

from apis.extension import KubeQOS
from apis.records import frozen
from koordlet.errors import (
    CgroupGoneError,
    HostError,
    InvalidValueError,
    KoordletError,
    UnsupportedError,
)
from koordlet.executor.originals import Original, OriginalsJournal
from koordlet.executor.ownedfile import OwnedFileWriter
from koordlet.executor.resctrl import parse_schemata
from koordlet.executor.sysctl import SystemFileWriter, notify, system_file
from koordlet.executor.writer import CgroupWriter, WriteResult
from koordlet.system.cgroups import CgroupVersion
from koordlet.system.host import Host
from koordlet.system.knobs import (
    CPU_BURST,
    CPU_BVT_WARP_NS,
    CPU_CFS_QUOTA,
    CPU_IDLE,
    CPUSET_CPUS,
    KNOBS,
    MEMORY_HIGH,
    MEMORY_LOW,
    MEMORY_MIN,
    MEMORY_OOM_GROUP,
    MEMORY_PRIORITY,
    MEMORY_USE_PRIORITY_OOM,
    MEMORY_WMARK_MIN_ADJ,
    MEMORY_WMARK_RATIO,
    MEMORY_WMARK_SCALE_FACTOR,
)

logger = logging.getLogger(__name__)

STRATEGY = "reset"
"""The name writes of ``koordlet reset`` carry in the audit log."""

KERNEL_DEFAULTS: Mapping[str, Any] = MappingProxyType(
    {
        CPU_BURST.name: 0,
        CPU_IDLE.name: 0,
        CPU_BVT_WARP_NS.name: 0,
        MEMORY_MIN.name: 0,
        MEMORY_LOW.name: 0,
        MEMORY_HIGH.name: None,
        MEMORY_WMARK_RATIO.name: 0,
        MEMORY_WMARK_SCALE_FACTOR.name: 50,
        MEMORY_WMARK_MIN_ADJ.name: 0,
        MEMORY_PRIORITY.name: 0,
        MEMORY_USE_PRIORITY_OOM.name: 0,
        MEMORY_OOM_GROUP.name: 0,
    }
)
"""The value a new cgroup has for each QoS knob the strategies set (Anolis' defaults for the
Anolis-only files)."""


@frozen
class Step:
    """One thing to put back."""

    kind: str
    """``cgroup``, ``sysctl``, ``resctrl_group``, ``resctrl_schemata``, ``tc_tree`` or
    ``owned_file``."""
    path: str
    """The file (the group's folder for ``resctrl_group``)."""
    knob: str
    """Knob or setting name."""
    rel_dir: str
    """The cgroup (cgroup steps)."""
    target: str
    """``default``, ``unlimited``, ``parent`` (cpuset), ``original`` or ``remove``."""
    original: Original | None
    """The journal's entry; None for the BE QoS cgroup's own steps."""

    @property
    def depth(self) -> int:
        return self.rel_dir.count("/") + 1 if self.rel_dir else 0


@frozen
class Outcome:
    """What one step did."""

    step: Step
    result: WriteResult | None = None
    """The write (``changed`` or, in a dry run, ``dry_run`` with what it would write)."""
    skipped: str = ""
    """Why nothing was done (the cgroup is gone, the file absent)."""
    error: str = ""
    """Why it failed."""

    @property
    def done(self) -> bool:
        """Put back, or nothing left to put back (the journal may forget it)."""
        return not self.error and (self.result is None or not self.result.dry_run)


def _qos_dirs(host: Host) -> frozenset[str]:
    layout = host.layout
    return frozenset(layout.qos_dir(q).strip("/") for q in KubeQOS)


def plan(host: Host, entries: Sequence[Original]) -> list[Step]:
    """The steps that put back ``entries`` (and reset the BE QoS cgroup), in the order to run."""
    qos_dirs = _qos_dirs(host)
    be_dir = host.layout.qos_dir(KubeQOS.BESTEFFORT).strip("/")
    steps: list[Step] = []
    seen: set[tuple[str, str]] = set()
    created_groups = {e.path for e in entries if e.kind == "resctrl_group"}
    for e in entries:
        if e.kind == "cgroup":
            if e.knob not in KNOBS:
                continue
            if e.knob == CPUSET_CPUS.name:
                target = "parent"
            elif e.knob == CPU_CFS_QUOTA.name and e.rel_dir in qos_dirs:
                target = "unlimited"
            elif e.knob in KERNEL_DEFAULTS:
                target = "default"
            else:
                target = "original"
            steps.append(Step(e.kind, e.path, e.knob, e.rel_dir, target, e))
            seen.add((e.rel_dir, e.knob))
        elif e.kind == "sysctl":
            steps.append(Step(e.kind, e.path, e.knob, "", "original", e))
        elif e.kind in ("resctrl_group", "tc_tree", "owned_file"):
            steps.append(Step(e.kind, e.path, e.knob, "", "remove", e))
        elif os.path.dirname(e.path) not in created_groups:  # schemata of a group found
            steps.append(Step(e.kind, e.path, e.knob, "", "original", e))
    layout = host.layout
    for knob, target in ((CPU_CFS_QUOTA, "unlimited"), (CPUSET_CPUS, "parent")):
        filename = knob.file_for(layout.version)
        if (be_dir, knob.name) in seen or filename is None:
            continue
        path = layout.file(knob.controller, be_dir, filename)
        steps.append(Step("cgroup", path, knob.name, be_dir, target, None))
    order = {"cgroup": 0, "sysctl": 1, "resctrl_schemata": 2, "resctrl_group": 3, "tc_tree": 4,
             "owned_file": 5}  # fmt: skip
    return sorted(steps, key=lambda s: (order[s.kind], s.depth, s.rel_dir, s.knob))


def _parent_cpus(writer: CgroupWriter, rel_dir: str) -> frozenset[int]:
    parent = rel_dir.rpartition("/")[0]
    return writer.read(CPUSET_CPUS, parent)


def _cgroup_step(step: Step, writer: CgroupWriter, host: Host) -> Outcome:
    knob = KNOBS[step.knob]
    if not os.path.isdir(os.path.dirname(step.path)):
        return Outcome(step, skipped="cgroup gone")
    value: Any
    if step.target == "unlimited":
        value = None
    elif step.target == "default":
        value = KERNEL_DEFAULTS[step.knob]
    elif step.target == "parent":
        value = _parent_cpus(writer, step.rel_dir)
        if not value and host.layout.version is CgroupVersion.V1:
            return Outcome(step, error="the parent's cpuset.cpus is empty: left alone")
    else:
        assert step.original is not None
        value = knob.decode(step.original.text, host.layout.version, path=step.path)
    reason = f"koordlet reset: {step.target} value"
    result = writer.write(knob, step.rel_dir, value, strategy=STRATEGY, reason=reason)
    return Outcome(step, result)


def _remove_group(step: Step, writer: CgroupWriter, on_change: Any) -> Outcome:
    path = step.path
    if not os.path.isdir(path):
        return Outcome(step, skipped="group gone")
    dry = writer.dry_run_all
    result = WriteResult(path, "created", "removed", not dry, "resctrl_group", STRATEGY,
                         "koordlet reset: made by the koordlet", dry)  # fmt: skip
    if not dry:
        try:
            os.rmdir(path)  # the kernel moves its threads back to the default group
        except OSError as err:
            if err.errno == errno.ENOENT:
                return Outcome(step, skipped="group gone")
            return Outcome(step, error=f"rmdir {path}: {err.strerror}")
    notify(on_change, result)
    return Outcome(step, result)


def _restore_schemata(step: Step, dry: bool, on_change: Any) -> Outcome:
    assert step.original is not None
    path, line = step.path, step.original.text
    try:
        with open(path, encoding="ascii") as f:
            current = parse_schemata(f.read(), path)
    except FileNotFoundError:
        return Outcome(step, skipped="group gone")
    except (OSError, KoordletError) as err:
        return Outcome(step, error=str(err))
    resource = line.split(":", 1)[0].strip()
    now = current.get(resource, {})
    now_line = f"{resource}:" + ";".join(f"{d}={v}" for d, v in sorted(now.items()))
    if parse_schemata(line, path).get(resource) == now:
        return Outcome(step, WriteResult(path, now_line, line, False, step.knob, STRATEGY))
    result = WriteResult(path, now_line, line, not dry, step.knob, STRATEGY,
                         "koordlet reset: original value", dry)  # fmt: skip
    if not dry:
        try:
            with open(path, "w", encoding="ascii") as f:
                f.write(line + "\n")
        except OSError as err:
            return Outcome(step, error=f"{path}: writing {line!r}: {err.strerror}")
    notify(on_change, result)
    return Outcome(step, result)


def remove_tree_step(step: Step, dry: bool, on_change: Any) -> Outcome:
    """Take down the network QoS tree of a ``tc_tree`` step (the interface gone, or a tree that
    is no longer the koordlet's: skipped, saying why)."""
    # Imported here: pyroute2 (netlink) loads only when there is a tree to take down.
    from koordlet.executor.tc import remove_tree

    interface = step.path.removeprefix("tc:")
    reason = "koordlet reset: the kernel's default root qdisc"
    tree = remove_tree(interface, strategy=STRATEGY, reason=reason, on_change=on_change,
                       dry_run=dry)  # fmt: skip
    if tree.refused:
        return Outcome(step, skipped=tree.refused)
    if not tree.changes:
        return Outcome(step, skipped="no koordlet tree left")
    old, new = "htb 1:", "the kernel's default"
    return Outcome(step, WriteResult(step.path, old, new, not dry, "tc_htb", STRATEGY, reason, dry))


def remove_owned_step(step: Step, dry: bool, on_change: Any) -> Outcome:
    """Remove the file of an ``owned_file`` step (already gone: skipped)."""
    files = OwnedFileWriter(on_change=on_change, is_dry_run=lambda _strategy: dry)
    reason = "koordlet reset: written by the koordlet"
    result = files.remove(step.path, knob=step.knob, strategy=STRATEGY, reason=reason)
    if result is None:
        return Outcome(step, skipped="file gone")
    return Outcome(step, result)


def apply(
    steps: Sequence[Step],
    *,
    host: Host,
    writer: CgroupWriter,
    sysfiles: SystemFileWriter,
    journal: OriginalsJournal | None = None,
) -> list[Outcome]:
    """Run ``steps`` in order, on this thread; each failure is reported in its
    :class:`Outcome` and the others go on. Unless it is a dry run, the journal forgets what was
    put back (and what is gone)."""
    outcomes = []
    for step in steps:
        try:
            if step.kind == "cgroup":
                outcome = _cgroup_step(step, writer, host)
            elif step.kind == "sysctl":
                assert step.original is not None
                result = sysfiles.restore(
                    system_file(step.knob), step.original.text, strategy=STRATEGY,
                    reason="koordlet reset: value before the first write",
                )  # fmt: skip
                outcome = Outcome(step, result)
            elif step.kind == "resctrl_group":
                outcome = _remove_group(step, writer, writer.on_change)
            elif step.kind == "tc_tree":
                outcome = remove_tree_step(step, writer.dry_run_all, writer.on_change)
            elif step.kind == "owned_file":
                outcome = remove_owned_step(step, writer.dry_run_all, writer.on_change)
            else:
                outcome = _restore_schemata(step, writer.dry_run_all, writer.on_change)
        except CgroupGoneError:
            outcome = Outcome(step, skipped="cgroup gone")
        except UnsupportedError as err:
            outcome = Outcome(step, skipped=str(err))
        except (HostError, InvalidValueError) as err:
            outcome = Outcome(step, error=str(err))
        outcomes.append(outcome)
    if journal is not None and not writer.dry_run_all:
        journal.forget(o.step.original.key for o in outcomes if o.done and o.step.original)
    return outcomes
