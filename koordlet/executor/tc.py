"""The network QoS tree on one interface: the HTB qdisc, its classes and the classid filter,
changed only where they differ from the plan, audited and dry-run like cgroup writes.

The tree (``apis.netqos``): ``htb 1: default 2``, the root class ``1:1`` and one class per QoS
class under it, and the ``koord_classid`` filter at ``1:`` (``koordlet.system.tc``). That filter
is the koordlet's signature: :meth:`TCWriter.remove` deletes a tree only when it carries it, and
:meth:`TCWriter.ensure` takes over an interface only when its root qdisc is one the kernel puts
there by itself (``noqueue``, ``pfifo_fast``, ``fq_codel``, ``mq``, ``fq``) or an HTB ``1:``
holding nothing but the koordlet's classes; any other root qdisc (a ``tbf``, someone else's HTB)
is left alone and reported.

Each change is handed to ``on_change`` as a :class:`~koordlet.executor.writer.WriteResult`
(``path`` ``tc:<interface>/class 1:4``, ``old`` and ``new`` in tc's words), the audit log's hook;
in dry run nothing is changed and the same results go to ``on_change`` with ``dry_run=True``,
once per distinct set of changes. Call on the executor's writer thread
(:func:`~koordlet.executor.sysctl.call_on_writer`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from apis.netqos import QDISC_HANDLE, format_handle
from apis.records import frozen
from koordlet.executor.originals import Original, Recorder
from koordlet.executor.sysctl import notify
from koordlet.executor.writer import WriteResult
from koordlet.system import tc
from koordlet.system.tc import BPF_PROG_NAME, TC_H_ROOT, HTBClass, Link

logger = logging.getLogger(__name__)

DEFAULT_ROOT_QDISCS = frozenset({"noqueue", "pfifo_fast", "fq_codel", "mq", "fq", "pfifo"})
"""Root qdiscs the kernel (or the distribution's ``net.core.default_qdisc``) installs itself:
replacing them takes nothing from anyone."""
FILTER_PRIO = 10
"""Priority of the classid filter at ``1:``."""
MIN_RATE_BYTES = 1000
"""HTB refuses a zero rate; a class guaranteed nothing gets 1 KB/s (8 kbit/s)."""
DRY_RUN_REPEAT = 60.0
"""Seconds before the same dry-run decision is audited again."""


@frozen
class ClassPlan:
    """One class of the tree, rates in bit/s as the NodeSLO says them."""

    name: str
    """``root``, ``system_class``, ``ls_class``, ``be_class``."""
    handle: int
    parent: int
    rate_bps: int
    ceil_bps: int
    prio: int

    def kernel(self) -> HTBClass:
        """The class as the kernel holds it: bytes per second, ceil at least the rate."""
        rate = max(MIN_RATE_BYTES, self.rate_bps // 8)
        return HTBClass(self.handle, self.parent, rate, max(rate, self.ceil_bps // 8), self.prio)


@frozen
class TreePlan:
    """The whole tree for one interface."""

    link: Link
    classes: tuple[ClassPlan, ...]
    default_minor: int
    owned_minors: range = range(0)
    """Minors the koordlet allocates itself (the pods' own classes): a class there that the
    plan does not hold is deleted."""


@dataclass(slots=True)
class TreeResult:
    """What :meth:`TCWriter.ensure` or :meth:`TCWriter.remove` found and did."""

    interface: str
    changes: list[str] = field(default_factory=list)
    """The changes made (or, in dry run, that would have been), in tc's words."""
    refused: str = ""
    """Why the interface was left alone; empty when the tree is (or would be) in place."""
    classes: dict[str, dict[str, Any]] = field(default_factory=dict)
    """The classes as the kernel holds them after the round, by tc name (``1:4``)."""
    dry_run: bool = False


def _set_class(ipr: Any, *, index: int, cls: HTBClass, exists: bool) -> None:
    tc.set_class(ipr, index, cls, exists=exists)


def _key(cls: HTBClass) -> tuple[int, int, int, int]:
    # The kernel shows a class added under the qdisc 1: with the parent TC_H_ROOT.
    parent = QDISC_HANDLE if cls.parent == TC_H_ROOT else cls.parent
    return parent, cls.rate, cls.ceil, cls.prio


def describe(cls: HTBClass) -> str:
    """A class in tc's words (``rate 10000kbit ceil 20000kbit prio 3``)."""
    return f"rate {cls.rate * 8 // 1000}kbit ceil {cls.ceil * 8 // 1000}kbit prio {cls.prio}"


def tree_path(interface: str) -> str:
    """How the originals journal names the tree on ``interface``."""
    return f"tc:{interface}"


def remove_tree(
    interface: str,
    *,
    strategy: str,
    reason: str,
    on_change: Callable[[WriteResult], None] | None = None,
    dry_run: bool = False,
) -> TreeResult:
    """Remove the koordlet's tree from ``interface`` (``koordlet reset``); an interface that is
    gone, or a tree that is not ours, is left alone (``refused`` says why)."""
    with tc.rtnl() as ipr:
        link = tc.link_by_name(ipr, interface)
    if link is None:
        result = TreeResult(interface, dry_run=dry_run)
        result.refused = f"no interface {interface}"
        return result
    writer = TCWriter(on_change=on_change, is_dry_run=lambda _strategy: dry_run)
    return writer.remove(link, strategy=strategy, reason=reason)


class TCWriter:
    """Applies :class:`TreePlan` objects; see the module docstring."""

    def __init__(
        self,
        *,
        on_change: Callable[[WriteResult], None] | None = None,
        is_dry_run: Callable[[str], bool] | None = None,
        record_original: Recorder | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.on_change = on_change
        """The audit hook (the cgroup writer's)."""
        self.record_original = record_original
        """The originals journal's hook: told before a tree first replaces an interface's
        default root qdisc, so ``koordlet reset`` removes it."""
        self.is_dry_run = is_dry_run or (lambda strategy: False)
        """Whether a strategy's changes are only computed and audited."""
        self._clock = clock
        self._last_dry: tuple[tuple[str, ...], float] | None = None

    def default_link(self) -> Link | None:
        """The interface of this namespace's default route, or None."""
        with tc.rtnl() as ipr:
            return tc.default_route_link(ipr)

    def ensure(self, plan: TreePlan, *, strategy: str, reason: str) -> TreeResult:
        """Bring ``plan.link``'s tree to ``plan``; see the module docstring."""
        link = plan.link
        dry = self.is_dry_run(strategy)
        result = TreeResult(link.name, dry_run=dry)
        ops: list[tuple[str, str, str, Callable[[Any], None]]] = []
        with tc.rtnl() as ipr:
            root = tc.root_qdisc(ipr, link.index)
            have = tc.htb_classes(ipr, link.index)
            ours = {c.handle for c in plan.classes}
            mine = root is not None and root.kind == "htb" and root.handle == QDISC_HANDLE
            if mine and root is not None and root.default != plan.default_minor:
                mine = False  # rebuilt below: HTB cannot change its default class in place
            if root is not None and not mine:
                foreign = set(have) - ours
                takeover = root.kind in DEFAULT_ROOT_QDISCS or (
                    root.kind == "htb" and root.handle == QDISC_HANDLE and not foreign
                )
                if not takeover:
                    result.refused = (
                        f"root qdisc {root.kind} {format_handle(root.handle)} on {link.name} "
                        "was not installed by the koordlet; not replacing it"
                    )
                    return result
            if not mine:
                old = "none" if root is None else f"{root.kind} {format_handle(root.handle)}"
                new = f"htb 1: default {plan.default_minor}"
                ops.append(
                    ("qdisc root", old, new, lambda i: self._replace(i, link, plan.default_minor))
                )
                have = {}
            for cp in plan.classes:
                want = cp.kernel()
                cur = have.get(cp.handle)
                same = cur is not None and _key(cur) == _key(want)
                if not same:
                    old = "none" if cur is None else describe(cur)
                    what = f"class {format_handle(cp.handle)} ({cp.name})"
                    setter = partial(_set_class, index=link.index, cls=want, exists=cur is not None)
                    ops.append((what, old, describe(want), setter))
            wanted = {cp.handle for cp in plan.classes}
            for handle, cur in sorted(have.items()):
                if (handle & 0xFFFF) in plan.owned_minors and handle not in wanted:
                    what = f"class {format_handle(handle)} (a pod's, no longer wanted)"
                    deleter = partial(tc.delete_class, index=link.index, handle=handle)
                    ops.append((what, describe(cur), "none", deleter))
            present = mine and any(
                f.kind == "bpf" and f.name == BPF_PROG_NAME
                for f in tc.filters(ipr, link.index, QDISC_HANDLE)
            )
            if not present:
                ops.append(
                    (
                        "filter 1:",
                        "none",
                        f"bpf {BPF_PROG_NAME} prio {FILTER_PRIO}",
                        lambda i: tc.add_classid_filter(i, link.index, QDISC_HANDLE, FILTER_PRIO),
                    )
                )
            if dry:
                self._audit_dry(link, ops, strategy, reason)
                result.changes = [f"{what}: {old} -> {new}" for what, old, new, _ in ops]
            else:
                if not mine and self.record_original is not None:
                    self.record_original(
                        Original("tc_tree", tree_path(link.name), "netqos", "", at=time.time())
                    )
                for what, old, new, run in ops:
                    run(ipr)
                    result.changes.append(f"{what}: {old} -> {new}")
                    notify(self.on_change, self._result(link, what, old, new, strategy, reason))
            result.classes = {
                format_handle(h): {"rate_bps": c.rate * 8, "ceil_bps": c.ceil * 8, "prio": c.prio}
                for h, c in sorted(tc.htb_classes(ipr, link.index).items())
            }
        if result.changes and not dry:
            logger.info("netqos tree on %s: %s", link.name, "; ".join(result.changes))
        return result

    def remove(self, link: Link, *, strategy: str, reason: str) -> TreeResult:
        """Delete ``link``'s tree when it carries the koordlet's filter; else leave it."""
        result = TreeResult(link.name, dry_run=self.is_dry_run(strategy))
        with tc.rtnl() as ipr:
            root = tc.root_qdisc(ipr, link.index)
            if root is None or root.kind != "htb" or root.handle != QDISC_HANDLE:
                return result
            if not any(f.name == BPF_PROG_NAME for f in tc.filters(ipr, link.index, QDISC_HANDLE)):
                result.refused = f"htb 1: on {link.name} has no {BPF_PROG_NAME} filter: not ours"
                return result
            change = ("qdisc root", "htb 1:", "the kernel's default")
            if result.dry_run:
                self._audit_dry(link, [(*change, lambda i: None)], strategy, reason)
            else:
                tc.delete_root(ipr, link.index)
                notify(self.on_change, self._result(link, *change, strategy, reason))
                logger.info("netqos tree on %s removed (%s)", link.name, reason)
            result.changes.append(f"{change[0]}: {change[1]} -> {change[2]}")
        return result

    def _replace(self, ipr: Any, link: Link, default_minor: int) -> None:
        root = tc.root_qdisc(ipr, link.index)
        if root is not None and root.kind == "htb" and root.handle == QDISC_HANDLE:
            tc.delete_root(ipr, link.index)
        tc.replace_root_htb(ipr, link.index, QDISC_HANDLE, default_minor)

    def _result(
        self,
        link: Link,
        what: str,
        old: str,
        new: str,
        strategy: str,
        reason: str,
        dry: bool = False,
    ) -> WriteResult:
        return WriteResult(
            f"tc:{link.name}/{what}", old, new, not dry, "tc_htb", strategy, reason, dry
        )

    def _audit_dry(
        self, link: Link, ops: list[tuple[str, str, str, Any]], strategy: str, reason: str
    ) -> None:
        key = tuple(f"{link.name}/{what}:{new}" for what, _old, new, _ in ops)
        now = self._clock()
        last = self._last_dry
        if not key or (last is not None and last[0] == key and now - last[1] < DRY_RUN_REPEAT):
            return
        self._last_dry = (key, now)
        for what, old, new, _ in ops:
            logger.info("dry run: tc %s on %s: %s -> %s", what, link.name, old, new)
            notify(self.on_change, self._result(link, what, old, new, strategy, reason, True))


__all__ = ["TC_H_ROOT", "ClassPlan", "TCWriter", "TreePlan", "TreeResult"]
