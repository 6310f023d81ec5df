"""What a change asks of a running container that no runtime applies: the koordlet does it.

Two parts of a :class:`~koordlet.runtimehooks.model.Change` concern a container's threads, which
exist only once it started: its resctrl group (the ``Resctrl`` hook; a pod's own group
``koordlet-<uid>`` that the resctrl strategy has not made yet is left to that strategy's next
round) and its core scheduling
cookie (``CoreSched``). :class:`ContainerEffects` applies them at ``PostStartContainer`` (both
proxy and NRI deliver it) and, for the cookie, in the reconciler; every file operation and
``prctl`` runs on the executor's writer thread, is audited (``strategy: runtimehooks/<hook>``) and
honours ``--dry-run``. A host that cannot (no resctrl mount, a kernel without core scheduling)
is reported once in :attr:`ContainerEffects.unsupported` (``/debug/capabilities``:
``runtimehooks/resctrl``, ``runtimehooks/coresched``) with the reason, and nothing is done.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from apis.pod_overrides import RESCTRL_GROUP_PREFIX
from koordlet.errors import CgroupGoneError, HostError, UnsupportedError
from koordlet.executor.sysctl import call_on_writer
from koordlet.runtimehooks.cgroupparent import rel_dir
from koordlet.runtimehooks.errors import BadPodInput
from koordlet.runtimehooks.model import Change, ContainerRequest, CoreSchedTarget, PodMeta
from koordlet.system.cgroups import CgroupLayout

if TYPE_CHECKING:
    from koordlet.executor.audit import AuditLog
    from koordlet.executor.resctrl import ResctrlWriter, TaskPlacement
    from koordlet.runtimehooks import cookies as cookie_ops
    from koordlet.system.host import Host

logger = logging.getLogger(__name__)

RUNTIMES = ("containerd", "cri-o", "docker")
"""The runtimes whose container cgroup names the koordlet knows (``CgroupLayout.container_dir``);
a hook request does not say which one created the container, so each name is tried."""


def container_dir(layout: CgroupLayout, req: ContainerRequest) -> str | None:
    """The container's cgroup (relative) as it exists now; None when not found."""
    try:
        pod_rel = rel_dir(req.pod_cgroup_parent)
    except BadPodInput:
        return None
    for runtime in RUNTIMES:
        try:
            rel = layout.container_dir(pod_rel, runtime, req.container_id)
        except (UnsupportedError, HostError, ValueError):
            continue
        if os.path.isdir(layout.abs_dir("cpu", rel)):
            return rel
    return None


def read_pids(layout: CgroupLayout, rel: str) -> list[int]:
    """The thread group ids in cgroup ``rel`` (``cgroup.procs`` of the cpu controller)."""
    path = layout.file("cpu", rel, "cgroup.procs")
    try:
        with open(path, encoding="ascii") as f:
            return sorted(int(line) for line in f if line.strip())
    except FileNotFoundError as err:
        raise CgroupGoneError(path) from err
    except (OSError, ValueError) as err:
        raise HostError(f"{path}: {err}") from err


class ContainerEffects:
    """See the module docstring. ``resctrl`` and ``cookies`` are None where the host cannot."""

    def __init__(
        self,
        host: Callable[[], Host | None],
        executor: object,
        audit: AuditLog | None,
        *,
        resctrl: ResctrlWriter | None,
        cookies: cookie_ops.CookieManager | None,
        unsupported: dict[str, str] | None = None,
        dry_run: bool = False,
    ) -> None:
        self._host = host
        self._executor = executor
        self._audit = audit
        self._resctrl = resctrl
        self._cookies = cookies
        self.unsupported: dict[str, str] = dict(unsupported or {})
        """``resctrl`` / ``coresched`` -> why this host cannot (``/debug/capabilities``)."""
        self._dry_run = dry_run

    def describe(self) -> dict[str, Any]:
        """JSON-ready: the cookie groups, what is unsupported."""
        groups = self._cookies.groups() if self._cookies is not None else {}
        return {
            "cookie_groups": {g: {"cookie": c, "threads": n} for g, (c, n) in groups.items()},
            "unsupported": dict(self.unsupported),
        }

    async def for_request(self, req: ContainerRequest, change: Change, *, strategy: str) -> None:
        """Apply ``change``'s thread-level parts to the container of a hook request."""
        host = self._host()
        if host is None:
            return
        rel = await asyncio.to_thread(container_dir, host.layout, req)
        if rel is None:
            logger.warning(
                "pod %s container %s (%s): cgroup not found under %s; resctrl group and core "
                "scheduling not applied",
                req.pod,
                req.container_name,
                req.container_id,
                req.pod_cgroup_parent,
            )
            return
        await self.apply(
            req.pod, f"{req.pod.uid}/{req.container_id}", rel, change, strategy=strategy
        )

    async def apply(
        self, pod: PodMeta, key: str, rel: str, change: Change, *, strategy: str
    ) -> None:
        """Apply ``change``'s resctrl group and core scheduling to the threads of cgroup
        ``rel`` (container ``key``: pod UID / container id)."""
        host = self._host()
        if host is None:
            return
        if change.resctrl_group is not None:
            await self._place(host.layout, pod, rel, change.resctrl_group, strategy, change.reason)
        if change.core_sched is not None:
            await self._cookie(host.layout, pod, key, rel, change.core_sched, strategy)

    def forget(self, key: str) -> None:
        """A container that is gone (its cookie bookkeeping goes)."""
        if self._cookies is not None:
            self._cookies.forget(key)

    async def _place(
        self, layout: CgroupLayout, pod: PodMeta, rel: str, group: str, strategy: str, why: str
    ) -> None:
        writer = self._resctrl
        if writer is None:
            return

        def place() -> TaskPlacement | None:
            if group.startswith(RESCTRL_GROUP_PREFIX) and not os.path.isdir(
                os.path.join(writer.root, group)
            ):
                return None  # a pod's own group the resctrl strategy has not made yet
            return writer.place_tasks(group, layout, [rel], strategy=strategy, reason=why)

        try:
            placed = await call_on_writer(self._executor, place)
        except UnsupportedError as err:
            self._report("resctrl", str(err))
            return
        except HostError as err:
            logger.warning("pod %s: threads of %s not moved into %s: %s", pod, rel, group, err)
            return
        if placed is None:
            logger.info(
                "pod %s: resctrl group %s not made yet; the resctrl strategy places %s at its "
                "next round",
                pod,
                group,
                rel,
            )
            return
        logger.debug("pod %s: %d threads of %s moved into %s", pod, placed.added, rel, group)

    async def _cookie(
        self,
        layout: CgroupLayout,
        pod: PodMeta,
        key: str,
        rel: str,
        goal: CoreSchedTarget,
        strategy: str,
    ) -> None:
        manager = self._cookies
        if manager is None:
            return
        try:
            pids = await asyncio.to_thread(read_pids, layout, rel)
        except HostError as err:  # CgroupGoneError too: the container is gone
            logger.debug("pod %s: threads of %s unreadable: %s", pod, rel, err)
            return
        want = f"group {goal.group!r}" if goal.enabled else "default cookie"
        if self._dry_run:
            self._record(strategy, f"core scheduling: {want}", rel, "", want, dry_run=True)
            return
        try:
            result = await call_on_writer(
                self._executor, lambda: manager.update(key, goal.group, goal.enabled, pids)
            )
        except (OSError, HostError, UnsupportedError) as err:
            logger.warning("pod %s: core scheduling of %s failed: %s", pod, rel, err)
            return
        if result is not None and (result.assigned or result.cleared or result.created):
            self._record(
                strategy,
                f"core scheduling: {want}",
                rel,
                "",
                f"cookie {result.cookie} ({result.assigned} assigned, {result.cleared} cleared"
                f"{', new cookie' if result.created else ''})",
            )

    def _report(self, what: str, why: str) -> None:
        if what not in self.unsupported:
            self.unsupported[what] = why
            logger.warning("runtime hooks: %s unsupported here: %s", what, why)

    def _record(
        self, strategy: str, reason: str, path: str, old: str, new: str, *, dry_run: bool = False
    ) -> None:
        if self._audit is not None:
            self._audit.record(
                "decision",
                strategy=strategy,
                reason=reason,
                path=path,
                knob="core_sched_cookie",
                old=old,
                new=new,
                dry_run=dry_run,
                detail={},
            )


def build_effects(
    host: Callable[[], Host | None],
    executor: object,
    audit: AuditLog | None,
    *,
    resctrl: bool,
    core_sched: bool,
    dry_run: bool,
    probe_core_sched: Callable[[], str] | None = None,
    make_ops: Callable[[], cookie_ops.CoreSchedOps] | None = None,
) -> ContainerEffects:
    """The effects for the enabled hooks, each probed once (``resctrl``: the mount;
    ``core_sched``: ``prctl``, by :mod:`koordlet.runtimehooks.cookies`, imported only then; tests
    pass their own probe and operations)."""
    from koordlet.executor.resctrl import ResctrlWriter
    from koordlet.executor.sysctl import executor_hooks
    from koordlet.system.resctrl import is_mounted, resctrl_root

    unsupported: dict[str, str] = {}
    writer = None
    detected = host()
    if resctrl and detected is not None:
        root = resctrl_root(detected.paths)
        if is_mounted(root):
            writer = ResctrlWriter(detected.paths, **executor_hooks(executor))
        else:
            unsupported["resctrl"] = f"resctrl is not mounted at {root}"
    manager = None
    if core_sched:
        from koordlet.runtimehooks import cookies as cookie_ops

        why = (probe_core_sched or cookie_ops.probe)()
        if why:
            unsupported["coresched"] = why
        else:
            manager = cookie_ops.CookieManager((make_ops or cookie_ops.PrctlCoreSched)())
    for what, reason in unsupported.items():
        logger.warning("runtime hooks: %s unsupported here: %s", what, reason)
    return ContainerEffects(
        host,
        executor,
        audit,
        resctrl=writer,
        cookies=manager,
        unsupported=unsupported,
        dry_run=dry_run,
    )
