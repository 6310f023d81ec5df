"""The standalone scheduler's binding cycles, beside its scheduling loop (kube-scheduler's
``bindingCycle``, run in a goroutine per pod).

:class:`BindingCycles` runs one owned task a pod once the loop has assumed it: an optional step
first (the pod's pending condition write, ``reporting.py``), then the :class:`Binder` (the
reserve annotations patched, the ``binding`` created), then ``on_bound``; an API error or an
``OSError`` calls ``on_failed`` instead (the scheduler forgets the pod and requeues it), as does
any other exception, logged as the bug it is. At most ``max_in_flight`` run at once:
:meth:`BindingCycles.start` waits for a slot beyond that, which holds the loop back only then.
:meth:`BindingCycles.close` cancels those in flight (a term that ends).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

from kubeclient.errors import KubeError
from kubeclient.resources import PODS
from scheduler_plugins.framework import Cycle
from scheduler_plugins.snapshot import PodInfo

logger = logging.getLogger(__name__)

MAX_IN_FLIGHT = 64
"""Binding cycles running at once at most (the loop waits for a slot beyond)."""

Bound = Callable[[PodInfo, str], None]
"""``on_bound(pod, node)``."""
Failed = Callable[[PodInfo, str, Cycle, "BaseException | str"], None]
"""``on_failed(pod, node, cycle, error)``."""


class Binder(Protocol):
    """Writes a placement to the cluster."""

    async def bind(self, pod: PodInfo, node: str, annotations: Mapping[str, str]) -> None:
        """Patch ``annotations`` on the pod, then bind it to ``node``. Raises
        :class:`~kubeclient.errors.KubeError` (or ``OSError``) on failure."""


class KubeBinder:
    """A :class:`Binder` through the API server (the ``binding`` subresource)."""

    def __init__(self, client: Any) -> None:
        self.client = client

    async def bind(self, pod: PodInfo, node: str, annotations: Mapping[str, str]) -> None:
        if annotations:
            await self.client.patch(
                PODS, pod.name, {"metadata": {"annotations": dict(annotations)}}, pod.namespace
            )
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": pod.name, "namespace": pod.namespace, "uid": pod.uid},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        await self.client.request("POST", PODS.path(pod.namespace, pod.name, "binding"), body=body)


class BindingCycles:
    """The binding cycles in flight (see the module docstring)."""

    def __init__(
        self,
        binder: Binder,
        *,
        on_bound: Bound,
        on_failed: Failed,
        before: Callable[[PodInfo], Awaitable[None]] | None = None,
        max_in_flight: int = MAX_IN_FLIGHT,
    ) -> None:
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight must be at least 1, got {max_in_flight}")
        self.binder = binder
        self.max_in_flight = max_in_flight
        """Binding cycles running at once at most."""
        self._on_bound = on_bound
        self._on_failed = on_failed
        self._before = before
        self._slots = asyncio.Semaphore(max_in_flight)
        self._tasks: set[asyncio.Task[None]] = set()

    def __len__(self) -> int:
        """Binding cycles running now."""
        return len(self._tasks)

    async def start(
        self, pod: PodInfo, node: str, cycle: Cycle, annotations: dict[str, str]
    ) -> None:
        """Start the binding cycle of ``pod`` (assumed on ``node``), after waiting for a slot
        when :attr:`max_in_flight` are running."""
        await self._slots.acquire()
        task = asyncio.get_running_loop().create_task(
            self._run(pod, node, cycle, annotations), name=f"scheduler-bind-{pod.key}"
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(
        self, pod: PodInfo, node: str, cycle: Cycle, annotations: dict[str, str]
    ) -> None:
        try:
            if self._before is not None:
                await self._before(pod)
            await self.binder.bind(pod, node, annotations)
        except (KubeError, OSError) as err:
            self._on_failed(pod, node, cycle, err)
            return
        except Exception:  # the task's guard: a bug, not the API server's answer
            logger.exception("binding %s to %s failed", pod.key, node)
            self._on_failed(pod, node, cycle, "internal error")
            return
        finally:
            self._slots.release()
        self._on_bound(pod, node)

    async def wait(self) -> None:
        """Wait until every binding cycle started so far (and since) has ended."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def close(self) -> None:
        """Cancel the binding cycles in flight."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
