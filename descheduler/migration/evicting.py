"""Evicting a job's pod: the Eviction API (honours PodDisruptionBudgets) or a plain delete.

Upstream's evictor interpreter (``controllers/migration/evictor``): the policy is the pod's
``koordinator.sh/evict-policy`` label, else the job's, else ``evictionPolicy`` (``Eviction`` by
default, ``Delete``); ``evictQPS`` and ``evictBurst`` bound the rate (a refused token is
``TooManyEvictions``, tried again at the next reconcile). The job's ``deleteOptions`` go with
the request, with a precondition on the pod's uid so a replacement of the same name is never hit.

A 429 from the Eviction API (a disruption budget says no) is :class:`EvictionRefused`: the
controller tries again later with backoff. It is never turned into a delete.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from apis.descheduler_keys import LABEL_EVICT_POLICY
from apis.podmigrationjob import PodMigrationJob
from descheduler.errors import DeschedulerError
from descheduler.migration.args import POLICIES, POLICY_DELETE, MigrationControllerArgs
from kubeclient.client import KubeClient
from kubeclient.errors import NotFound, TooManyRequests
from kubeclient.resources import PODS
from scheduler_plugins.snapshot import PodInfo


class EvictionError(DeschedulerError):
    """The pod was not evicted this time."""


class TooManyEvictions(EvictionError):
    """``ErrTooManyEvictions``: the controller's own rate (``evictQPS``) says wait."""


class EvictionRefused(EvictionError):
    """The API server answered 429: the pod's disruption budget allows no eviction now."""

    def __init__(self, message: str, retry_after: float | None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class TokenBucket:
    """``flowcontrol.NewTokenBucketRateLimiter(qps, burst)``'s ``TryAccept``."""

    def __init__(self, qps: float, burst: int, clock: Callable[[], float]) -> None:
        self.qps = qps
        self.burst = burst
        self.clock = clock
        self._tokens = float(burst)
        self._at = clock()

    def try_accept(self) -> bool:
        if self.qps <= 0:
            return True
        now = self.clock()
        self._tokens = min(float(self.burst), self._tokens + (now - self._at) * self.qps)
        self._at = now
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return True
        return False


def policy_of(pod: PodInfo, job: PodMigrationJob, default: str) -> str:
    """The eviction policy for this pod and job (see the module docstring)."""
    for labels in (pod.labels, job.labels):
        value = labels.get(LABEL_EVICT_POLICY, "")
        if value in POLICIES:
            return value
    return default


class PodEvicter:
    """See the module docstring."""

    def __init__(
        self,
        client: KubeClient,
        args: MigrationControllerArgs,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client
        self.args = args
        self.bucket = TokenBucket(args.evict_qps, args.evict_burst, clock)

    async def evict(
        self, job: PodMigrationJob, pod: PodInfo, delete_options: Mapping[str, Any] | None
    ) -> str:
        """Evict (or delete) ``pod``; the policy used. Raises :class:`EvictionError`
        (:class:`EvictionRefused` for a 429); a pod already gone is not an error."""
        if not self.bucket.try_accept():
            raise TooManyEvictions("TooManyEvictions")
        policy = policy_of(pod, job, self.args.eviction_policy)
        options = dict(delete_options or {})
        try:
            if policy == POLICY_DELETE:
                options["preconditions"] = {**(options.get("preconditions") or {}), "uid": pod.uid}
                await self.client.delete(PODS, pod.name, pod.namespace, options=options)
            else:
                await self.client.evict(
                    pod.namespace, pod.name, uid=pod.uid, delete_options=options or None
                )
        except NotFound:
            return policy
        except TooManyRequests as err:
            raise EvictionRefused(str(err), err.retry_after) from err
        return policy
