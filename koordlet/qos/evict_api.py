"""The Kubernetes Eviction API backend of the QoS evictor (``--only-evict-by-api``).

:class:`EvictionApiBackend` implements :class:`koordlet.qos.evictor.EvictionBackend`: it POSTs a
``policy/v1`` Eviction for the victim pod, with the pod's UID as precondition so that a new pod
that took the same name is never evicted in its place. The :class:`~koordlet.qos.evictor.Evictor`
keeps deciding who may go (eligibility, dedupe, cap, dry run, audit); this backend only asks.

How answers are read:

- **201/200**: evicted; the UID is remembered for ``remember`` seconds (:meth:`is_evicted`) and
  a repeated request for it is not sent again (reported ``gone``: the pod is terminating). An
  Event ``evictPodSuccess`` (Warning) is recorded on the pod, as Koordinator's evictor does,
  named ``<pod>.<hex nanoseconds>`` as client-go's recorder names events (best effort: a failed
  Event is logged);
- **429** (a PodDisruptionBudget refuses, or the API server throttles): the eviction *fails for
  this round* and is retried in a later round, not before ``Retry-After`` (default
  ``retry_after_default``). It is never turned into a kill: the disruption budget is the
  cluster owner's decision;
- **404** (the pod is gone) and **409** (the UID precondition failed: the name now belongs to
  another pod): the victim has ended; reported ``gone``;
- anything else (5xx, the API server unreachable, 403): the eviction fails and is retried next
  round.

Upstream's ``--only-evict-by-api`` (default false) chooses the act, not a fallback: false kills
the victim's containers through the runtime and never calls the API; true evicts only through
the API, and a refused or failed call leaves the pod running. The daemon does the same: the flag
picks :class:`~koordlet.qos.evictor.CgroupKillEvictor` (false) or this backend (true). With the
flag true and the API server down, memory and CPU eviction cannot act; suppression and the
kernel's OOM killer still protect the node (see docs/kubernetes.md).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from koordlet.qos.evictor import EvictionFailed, Victim
from kubeclient.client import KubeClient
from kubeclient.errors import ApiError, Conflict, NotFound, TooManyRequests
from kubeclient.events import core_event
from kubeclient.resources import EVENTS

logger = logging.getLogger(__name__)

EVENT_REASON_SUCCESS = "evictPodSuccess"
"""Reason of the Event recorded on an evicted pod (Koordinator's evictor)."""
EVENT_COMPONENT = "koordlet"

DEFAULT_RETRY_AFTER = 10.0
"""Seconds before a refused eviction is asked again when the answer gave no Retry-After."""
DEFAULT_REMEMBER = 600.0
"""Seconds an evicted UID is remembered (the pod may take its grace period to go)."""


class EvictionApiBackend:
    """Evicts pods through ``POST .../pods/<name>/eviction`` (module docstring).

    :param client: the API client.
    :param node_name: this node (the Event's ``source.host``).
    :param retry_after_default: seconds to wait after a 429 without ``Retry-After``.
    :param remember: seconds an evicted UID stays in :attr:`evicted`.
    :param record_events: whether to record an Event on each evicted pod.
    :param clock: monotonic seconds.
    """

    name = "eviction-api"

    def __init__(
        self,
        client: KubeClient,
        *,
        node_name: str = "",
        retry_after_default: float = DEFAULT_RETRY_AFTER,
        remember: float = DEFAULT_REMEMBER,
        record_events: bool = True,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._client = client
        self.node_name = node_name
        self.retry_after_default = retry_after_default
        self.remember = remember
        self.record_events = record_events
        self._clock = clock
        self._wall_clock = wall_clock
        self.evicted: dict[str, float] = {}
        """Pod UID → when its eviction was accepted."""
        self.retry_at: dict[str, float] = {}
        """Pod UID → when a refused eviction may be asked again."""

    def is_evicted(self, uid: str) -> bool:
        """Whether an eviction of the pod ``uid`` was accepted within ``remember`` seconds."""
        self._expire()
        return uid in self.evicted

    def _expire(self) -> None:
        now = self._clock()
        for uid in [u for u, at in self.evicted.items() if now - at >= self.remember]:
            del self.evicted[uid]
        for uid in [u for u, at in self.retry_at.items() if at <= now]:
            del self.retry_at[uid]

    async def evict(self, victim: Victim, *, reason: str, message: str) -> str:
        pod = victim.pod
        if pod is None:
            raise EvictionFailed(victim.key, "not a pod: the Eviction API cannot evict it")
        if not pod.namespace or not pod.uid:
            raise EvictionFailed(victim.key, "pod without a namespace or UID")
        if self.is_evicted(pod.uid):
            return "gone"  # accepted earlier: it is terminating, not evicted again
        wait = self.retry_at.get(pod.uid)
        if wait is not None:
            raise EvictionFailed(
                victim.key, f"eviction refused earlier; retry in {wait - self._clock():.0f}s"
            )
        try:
            await self._client.evict(pod.namespace, pod.name, uid=pod.uid)
        except (NotFound, Conflict):
            return "gone"
        except TooManyRequests as err:
            delay = err.retry_after if err.retry_after is not None else self.retry_after_default
            self.retry_at[pod.uid] = self._clock() + delay
            raise EvictionFailed(
                victim.key, f"eviction refused (429: {err.message}); retried after {delay:.0f}s"
            ) from err
        except ApiError as err:
            raise EvictionFailed(victim.key, f"eviction API: {err}") from err
        self.evicted[pod.uid] = self._clock()
        if self.record_events:
            await self._event(pod.namespace, pod.name, pod.uid, reason, message)
        return "eviction-api: policy/v1 Eviction accepted"

    async def _event(self, namespace: str, name: str, uid: str, reason: str, message: str) -> None:
        involved = {"apiVersion": "v1", "kind": "Pod", "namespace": namespace, "name": name}
        event = core_event(
            {**involved, "uid": uid},
            reason=EVENT_REASON_SUCCESS,
            message=f"evict Pod:{name}, reason: {reason}, message: {message}",
            component=EVENT_COMPONENT,
            host=self.node_name,
            now=self._wall_clock(),
        )
        try:
            await self._client.create(EVENTS, event)
        except ApiError as err:
            logger.info("event for evicted pod %s/%s not recorded: %s", namespace, name, err)
