"""Writing Reservations' status: placed, unschedulable, and who consumes them.

:class:`ReservationWriter` writes through the ``status`` subresource, re-reading the object and
retrying on conflict (``kubeclient.writes.update_status``).

:class:`OwnerSync` keeps ``status.currentOwners`` and ``status.allocated`` of Available
Reservations in line with the pods that consume them, as koord-scheduler's reservation
controller does (``pkg/scheduler/plugins/reservation/controller``, ``syncStatus``):

- the owners are the pods bound (per the API server: ``spec.nodeName`` set; pods the scheduler
  only assumed do not count) to the Reservation's ``status.nodeName``, not finished, whose
  ``scheduling.koordinator.sh/reservation-allocated`` annotation names it (by uid, else by name),
  as ``{namespace, name, uid}`` sorted by uid;
- ``allocated`` is the sum of their requests, limited to the resources of ``status.allocatable``;
- nothing is written when both already say so; otherwise both are written and, with
  ``spec.allocateOnce`` (default true), the Reservation becomes ``Succeeded`` (its ``Ready``
  condition False with reason ``Succeeded``: upstream ``SetReservationSucceeded``), after which
  it is left alone, as are ``Failed`` ones and those without a node.

A pod event marks the Reservation its annotation names, a Reservation event marks that one;
:meth:`OwnerSync.flush` writes the marked ones: the standalone scheduler's loop calls it, the
extender (with ``--bind``) runs :meth:`OwnerSync.run`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any, NoReturn

from apis.scheduling_keys import ANNOTATION_RESERVATION_ALLOCATED
from apis.timestamp import format_time
from kubeclient.errors import KubeError, NotFound
from kubeclient.resources import RESERVATIONS
from kubeclient.writes import update_status
from scheduler_plugins.errors import InputError
from scheduler_plugins.objectfields import ResourceList, add_into, parse_resource_list
from scheduler_plugins.reservations import (
    CONDITION_READY,
    PHASE_AVAILABLE,
    available_status,
    format_resources,
    is_pending,
    uid_of_reservation,
    unschedulable_status,
)
from scheduler_plugins.snapshot import Snapshot

logger = logging.getLogger(__name__)

PHASE_SUCCEEDED = "Succeeded"
REASON_SUCCEEDED = "Succeeded"
RETRY_S = 1.0
"""Pause before the extender's owner sync retries (a failed write, informers not current)."""


class ReservationWriter:
    """Writes Reservations' status through the ``status`` subresource (re-read and retried
    on conflict); ``client`` ``None``: only logs, and a placement counts as written."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.written = 0
        """Status writes made so far."""

    async def placed(
        self, name: str, node: str, requests: dict[str, int], now: float
    ) -> dict[str, Any] | None:
        """Mark ``name`` Available on ``node``; the written object, or ``None`` when it is no
        longer Pending (someone else placed it, or it expired meanwhile). Raises
        :class:`KubeError` (NotFound when it was deleted)."""

        def build(current: dict[str, Any]) -> dict[str, Any] | None:
            if not is_pending(current, now):
                return None
            return available_status(current, node, requests, now)

        if self.client is None:
            return {"metadata": {"name": name}}
        obj: dict[str, Any] | None = await update_status(self.client, RESERVATIONS, name, build)
        if obj is not None:
            self.written += 1
        return obj

    async def unschedulable(self, name: str, message: str, now: float) -> None:
        """Set the ``Scheduled`` condition of ``name`` False/``Unschedulable`` with
        ``message`` (errors logged: the reservation is retried anyway)."""

        def build(current: dict[str, Any]) -> dict[str, Any] | None:
            if not is_pending(current, now):
                return None
            status = unschedulable_status(current, message, now)
            return None if status == current.get("status") else status

        if self.client is None:
            return
        try:
            if await update_status(self.client, RESERVATIONS, name, build) is not None:
                self.written += 1
        except (KubeError, InputError) as err:
            logger.warning("status of Reservation %s not written: %s", name, err)


def allocated_to(obj: Mapping[str, Any]) -> tuple[str, str] | None:
    """``(name, uid)`` of the Reservation a pod object's reservation-allocated annotation
    names; ``None`` without (or with an unreadable) one."""
    raw = ((obj.get("metadata") or {}).get("annotations") or {}).get(
        ANNOTATION_RESERVATION_ALLOCATED
    )
    if not raw:
        return None
    try:
        loaded = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(loaded, dict):
        return None
    return str(loaded.get("name") or ""), str(loaded.get("uid") or "")


def owners_status(obj: Mapping[str, Any], snapshot: Snapshot, now: float) -> dict[str, Any] | None:
    """The status of an Available Reservation with its owners and allocated brought up to date
    from ``snapshot``'s bound pods; ``None`` when it already says so or is not Available on a
    node (see the module docstring)."""
    status = obj.get("status") or {}
    node_name = str(status.get("nodeName") or "")
    if status.get("phase") != PHASE_AVAILABLE or not node_name:
        return None
    name = str((obj.get("metadata") or {}).get("name") or "")
    uid = uid_of_reservation(obj)
    source = f"Reservation {name}"
    allocatable = parse_resource_list(status.get("allocatable"), source, "status.allocatable")
    node = snapshot.nodes.get(node_name)
    owners: list[dict[str, str]] = []
    allocated: ResourceList = {}
    for pod in node.pods.values() if node is not None else ():
        if not (pod.raw.get("spec") or {}).get("nodeName"):
            continue  # assumed by us, not bound yet
        target = allocated_to(pod.raw)
        if target is None or (target[1] != uid if target[1] else target[0] != name):
            continue
        owners.append({"namespace": pod.namespace, "name": pod.name, "uid": pod.uid})
        add_into(allocated, {r: v for r, v in pod.requests.items() if r in allocatable})
    owners.sort(key=lambda o: o["uid"])
    current = sorted(
        (
            {k: str(o.get(k) or "") for k in ("namespace", "name", "uid")}
            for o in status.get("currentOwners") or []
            if isinstance(o, Mapping)
        ),
        key=lambda o: o["uid"],
    )
    written = parse_resource_list(status.get("allocated"), source, "status.allocated")
    if current == owners and {r: v for r, v in written.items() if v} == {
        r: v for r, v in allocated.items() if v
    }:
        return None
    new = dict(status)
    new["currentOwners"] = owners
    new["allocated"] = format_resources(allocated)
    allocate_once = (obj.get("spec") or {}).get("allocateOnce", True) is not False
    if allocate_once:
        new["phase"] = PHASE_SUCCEEDED
        stamp = format_time(now)
        conditions = [dict(c) for c in status.get("conditions") or [] if isinstance(c, Mapping)]
        ready = next((c for c in conditions if c.get("type") == CONDITION_READY), None)
        if ready is None:
            conditions.append(
                {
                    "type": CONDITION_READY,
                    "status": "False",
                    "reason": REASON_SUCCEEDED,
                    "lastProbeTime": stamp,
                    "lastTransitionTime": stamp,
                }
            )
        else:
            ready.update({"status": "False", "reason": REASON_SUCCEEDED, "lastProbeTime": stamp})
        new["conditions"] = conditions
    return new


class OwnerSync:
    """Writes the owners of the Reservations marked since the last :meth:`flush` (see the
    module docstring); the informers' handlers mark them."""

    def __init__(self, client: Any, snapshot: Snapshot) -> None:
        self.client = client
        self.snapshot = snapshot
        self.dirty: set[str] = set()
        """Reservation names to look at."""
        self.written = 0
        """Status writes made so far."""
        self._marked = asyncio.Event()

    def pod_changed(self, obj: Mapping[str, Any]) -> None:
        """Informer hook: a pod was added, changed or deleted."""
        target = allocated_to(obj)
        if target is not None and target[0]:
            self.dirty.add(target[0])
            self._marked.set()

    def reservation_changed(self, obj: Mapping[str, Any]) -> None:
        """Informer hook: a Reservation was added or changed."""
        name = str((obj.get("metadata") or {}).get("name") or "")
        if name:
            self.dirty.add(name)
            self._marked.set()

    async def run(
        self,
        ready: Callable[[], list[str]],
        clock: Callable[[], float] = time.time,
        retry_s: float = RETRY_S,
    ) -> NoReturn:
        """Flush whenever something is marked and ``ready()`` names nothing missing (what
        the informers have not listed yet is not known to own nothing); a failed write is
        retried after ``retry_s``."""
        while True:
            await self._marked.wait()
            self._marked.clear()
            if not ready():
                await self.flush(clock())
            if self.dirty:
                await asyncio.sleep(retry_s)
                self._marked.set()

    async def flush(self, now: float) -> None:
        """Write the owners of every marked Reservation that needs it (errors logged; a
        Reservation whose write failed stays marked)."""
        if not self.dirty:
            return
        names, self.dirty = self.dirty, set()
        for name in sorted(names):
            obj = self.snapshot.reservations.get(name)
            try:
                if obj is None or owners_status(obj, self.snapshot, now) is None:
                    continue
                await self._write(name, now)
            except NotFound:
                continue  # deleted meanwhile
            except (KubeError, InputError) as err:
                logger.warning("owners of Reservation %s not written: %s", name, err)
                self.dirty.add(name)

    async def _write(self, name: str, now: float) -> None:
        def build(current: dict[str, Any]) -> dict[str, Any] | None:
            return owners_status(current, self.snapshot, now)

        if self.client is None:
            return
        written = await update_status(self.client, RESERVATIONS, name, build)
        if written is not None:
            self.written += 1
            status = written.get("status") or {}
            logger.info(
                "Reservation %s: owners %s, phase %s",
                name,
                [o.get("name") for o in status.get("currentOwners") or []],
                status.get("phase"),
            )
