"""Leader election on a ``coordination.k8s.io/v1`` Lease, as client-go's ``leaderelection`` does.

One candidate holds the Lease (``spec.holderIdentity``) and renews it (``spec.renewTime``) every
``retry_period``; the others watch it. A candidate takes the Lease over only when it has not seen
the record change for ``lease_duration`` by its *own* clock (the observed-time rule: clocks of
different machines are never compared). Every write is a compare-and-swap on the Lease's
``resourceVersion``, so two candidates racing for it cannot both win: the loser gets a 409 and
stays a follower. A leader that cannot renew for ``renew_deadline`` steps down (``on_change``
with False) before anyone else may take over (``renew_deadline < lease_duration``).
:meth:`LeaderElector.release` empties the holder so a successor need not wait for it to expire.

This module is the Lease alone; what runs while holding it, and the order of stopping, is
:mod:`kubeclient.elected`'s. Defaults are client-go's (``tools/leaderelection``) and
Koordinator's manager's: 15 s lease, 10 s renew deadline, 2 s retry.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable
from typing import Any

from apis.records import frozen
from apis.timestamp import format_micro_time
from kubeclient.client import KubeClient, Obj
from kubeclient.errors import ApiError, KubeError, NotFound
from kubeclient.resources import LEASES

logger = logging.getLogger(__name__)


@frozen
class LeaderElectionConfig:
    """Timing and identity of one candidate."""

    namespace: str
    """Namespace of the Lease (``koordinator-system``)."""
    name: str
    """Name of the Lease (``koord-manager``)."""
    identity: str
    """This candidate's identity (:func:`identity`: host name and a unique suffix)."""
    lease_duration: float = 15.0
    """Seconds a follower waits, after the last change it saw, before taking over."""
    renew_deadline: float = 10.0
    """Seconds a leader keeps trying to renew before stepping down (< ``lease_duration``)."""
    retry_period: float = 2.0
    """Seconds between attempts to acquire or renew."""

    def __post_init__(self) -> None:
        if not 0 < self.retry_period < self.renew_deadline < self.lease_duration:
            raise ValueError("need 0 < retry_period < renew_deadline < lease_duration")


def identity() -> str:
    """A candidate identity as client-go's users build it: the host (in a pod, the pod's name:
    ``$POD_NAME`` when set), ``_`` and a UUID, so a restarted replica is a new candidate."""
    host = os.environ.get("POD_NAME") or socket.gethostname()
    return f"{host}_{uuid.uuid4()}"


class LeaderElector:
    """Runs the election for one candidate; ``is_leader`` says where it stands."""

    def __init__(
        self,
        client: KubeClient,
        config: LeaderElectionConfig,
        *,
        on_change: Callable[[bool], None] = lambda _leading: None,
        wall_clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._client = client
        self.config = config
        self._on_change = on_change
        self._wall = wall_clock
        self._mono = monotonic
        self.is_leader = False
        self._observed_spec: Any = None
        self._observed_at = 0.0
        self._last_renew = 0.0

    async def try_acquire_or_renew(self) -> bool:
        """One attempt; whether this candidate holds the Lease afterwards."""
        cfg = self.config
        now_wall, now = self._wall(), self._mono()
        try:
            lease = await self._client.get(LEASES, cfg.name, cfg.namespace)
        except NotFound:
            body: Obj = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": cfg.name, "namespace": cfg.namespace},
                "spec": self._spec(None, now_wall),
            }
            try:
                await self._client.create(LEASES, body)
            except ApiError as err:
                logger.debug("lease %s/%s: create lost: %s", cfg.namespace, cfg.name, err)
                return False
            self._observe(body["spec"], now)
            return True
        spec = lease.get("spec") or {}
        if spec != self._observed_spec:
            self._observe(spec, now)
        holder = spec.get("holderIdentity") or ""
        duration = float(spec.get("leaseDurationSeconds") or cfg.lease_duration)
        if holder and holder != cfg.identity and self._observed_at + duration > now:
            return False  # someone else holds it and it has not expired by our clock
        lease["spec"] = self._spec(spec, now_wall)
        try:
            updated = await self._client.replace(LEASES, lease)
        except ApiError as err:
            logger.debug("lease %s/%s: update lost: %s", cfg.namespace, cfg.name, err)
            return False
        self._observe(updated.get("spec") or {}, now)
        return True

    def _spec(self, old: Obj | None, now_wall: float) -> Obj:
        cfg = self.config
        old = old or {}
        mine = old.get("holderIdentity") == cfg.identity
        transitions = int(old.get("leaseTransitions") or 0)
        return {
            "holderIdentity": cfg.identity,
            "leaseDurationSeconds": int(cfg.lease_duration),
            "acquireTime": old.get("acquireTime") if mine else format_micro_time(now_wall),
            "renewTime": format_micro_time(now_wall),
            "leaseTransitions": transitions if mine or not old else transitions + 1,
        }

    def _observe(self, spec: Any, now: float) -> None:
        self._observed_spec = spec
        self._observed_at = now

    def _set_leader(self, leading: bool) -> None:
        if leading == self.is_leader:
            return
        self.is_leader = leading
        cfg = self.config
        logger.info(
            "%s %s leadership of lease %s/%s",
            cfg.identity,
            "acquired" if leading else "lost",
            cfg.namespace,
            cfg.name,
        )
        try:
            self._on_change(leading)
        except Exception:
            logger.exception("leader election callback failed")

    async def step(self) -> None:
        """One round: acquire or renew; a leader past its renew deadline steps down.

        The attempt itself is bounded: a leader's by what is left of its renew deadline (a
        request hanging for the client's timeout must not keep it leading after another
        candidate may have taken the Lease), a follower's by the renew deadline.
        """
        cfg = self.config
        budget = cfg.renew_deadline
        if self.is_leader:
            budget = self._last_renew + cfg.renew_deadline - self._mono()
            if budget <= 0:
                self._set_leader(False)
                budget = cfg.renew_deadline
        try:
            async with asyncio.timeout(budget):
                held = await self.try_acquire_or_renew()
        except KubeError as err:
            logger.warning("lease %s: %s", cfg.name, err)
            held = False
        except TimeoutError:
            logger.warning("lease %s: no answer within %.1fs", cfg.name, budget)
            held = False
        now = self._mono()
        if held:
            self._last_renew = now
            self._set_leader(True)
        elif self.is_leader and now - self._last_renew >= self.config.renew_deadline:
            self._set_leader(False)

    def pause(self) -> float:
        """Seconds to the next :meth:`step`: the retry period, shortened for a leader so that
        it notices its renew deadline passing on time."""
        wait = self.config.retry_period
        if self.is_leader:
            wait = min(wait, max(self._last_renew + self.config.renew_deadline - self._mono(), 0))
        return wait

    async def release(self) -> bool:
        """Empty the Lease's holder (1 s duration, so a successor need not wait for it to
        expire) if it names this candidate, whatever :attr:`is_leader` says (a create or
        renewal whose answer was lost may have made us the holder unknowingly); this candidate
        no longer leads afterwards (``on_change`` is not called: the caller is stopping).
        Whether the Lease was emptied; a failure is logged, not raised."""
        cfg = self.config
        self.is_leader = False
        try:
            lease = await self._client.get(LEASES, cfg.name, cfg.namespace)
            spec = lease.get("spec") or {}
            if spec.get("holderIdentity") != cfg.identity:
                return False
            spec["holderIdentity"] = ""
            spec["leaseDurationSeconds"] = 1
            lease["spec"] = spec
            await self._client.replace(LEASES, lease)
        except KubeError as err:
            logger.warning("lease %s: release failed: %s", cfg.name, err)
            return False
        logger.info("%s released lease %s/%s", cfg.identity, cfg.namespace, cfg.name)
        return True
