"""What several QoS strategies share; strategies import this, never each other.

- :func:`pod_class`: the Koordinator class a pod is treated as (cgreconcile, resctrl);
- :func:`cpus_of_annotation`: a pod's CPUs from its ``resource-status`` (cpusuppress,
  cgreconcile);
- :func:`eviction_policy_allowed` and :class:`InvalidThreshold`: the eviction strategies' opt-out
  annotation and their refused threshold combinations (memoryevict, cpuevict);
- :func:`node_resources`: the Node's capacity or allocatable as upstream reads the quantities
  (memoryevict, cpuevict);
- :class:`WriteFailures`: the writes the kernel refused, each logged once per change with a
  count (cpusuppress, cgreconcile, cpuburst).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from apis.cpulist import parse_cpulist
from apis.extension import ANNOTATION_RESOURCE_STATUS, KUBE_QOS_TO_QOS, QoSClass
from apis.quantity import int_value, milli_value
from koordlet.qos.evictor import ANNOTATION_EVICTION_POLICY
from koordlet.statesinformer.model import PodInfo


class InvalidThreshold(ValueError):
    """A NodeSLO threshold combination upstream refuses (the task is skipped, not failed)."""


def pod_class(pod: PodInfo) -> QoSClass:
    """The Koordinator class a pod is treated as: its label, else its Kubernetes QoS's."""
    if pod.qos is not QoSClass.NONE:
        return pod.qos
    return KUBE_QOS_TO_QOS.get(pod.kube_qos, QoSClass.LS)


def cpus_of_annotation(annotations: Mapping[str, str]) -> frozenset[int]:
    """CPUs of a pod's ``scheduling.koordinator.sh/resource-status`` cpuset; empty when none or
    malformed."""
    raw = annotations.get(ANNOTATION_RESOURCE_STATUS)
    if not raw:
        return frozenset()
    try:
        status = json.loads(raw)
        text = status.get("cpuset", "") if isinstance(status, dict) else ""
        return parse_cpulist(text) if isinstance(text, str) else frozenset()
    except ValueError:
        return frozenset()


def eviction_policy_allowed(pod: PodInfo, feature: str) -> bool:
    """``koordinator.sh/eviction-policy`` (a JSON list of features) allows ``feature``; absent:
    allowed; unparsable: refused, as upstream."""
    text = pod.annotations.get(ANNOTATION_EVICTION_POLICY)
    if text is None:
        return True
    try:
        policies = json.loads(text)
    except ValueError:
        return False
    return isinstance(policies, list) and feature in policies


def node_resources(node: Mapping[str, Any] | None, field: str) -> dict[str, int] | None:
    """``status.<field>`` (``capacity`` or ``allocatable``) of a Node object as upstream's
    ``ConvertQuantityToInt64`` reads each quantity: ``cpu`` in milli-cores, anything else by its
    integer value (bytes; ``kubernetes.io/batch-cpu`` is already milli-cores). None without a Node
    or that field; a quantity that does not parse is left out (logged by the caller's report)."""
    status = (node or {}).get("status")
    values = status.get(field) if isinstance(status, Mapping) else None
    if not isinstance(values, Mapping):
        return None
    out: dict[str, int] = {}
    for name, raw in values.items():
        if isinstance(raw, bool) or not isinstance(raw, str | int | float):
            continue
        try:
            out[str(name)] = milli_value(raw) if name == "cpu" else int_value(raw)
        except ValueError:
            continue
    return out


MAX_FAILING = 1024
"""Failing writes remembered per strategy; beyond, the oldest is forgotten (logged again if it
fails again)."""


@dataclass(slots=True)
class _Failing:
    error: str
    count: int
    since: float


class WriteFailures:
    """The writes of one strategy that the kernel refuses, keyed by what they write
    (``cpu_cfs_quota kubepods/besteffort``): each write's failure is its own, and is logged at
    warning when it starts or its error changes, counted (not logged) while it repeats, and
    logged at info with the count when the write succeeds again. A strategy reports
    :meth:`describe` in ``/debug/qos``.

    :param strategy: the strategy's name, the prefix of the log lines.
    :param log: where the lines go (the strategy module's logger).
    """

    def __init__(
        self, strategy: str, log: logging.Logger, *, clock: Callable[[], float] = time.time
    ) -> None:
        self.strategy = strategy
        self._log = log
        self._clock = clock
        self._failing: dict[str, _Failing] = {}

    def failed(self, key: str, error: str) -> None:
        """The write of ``key`` was refused with ``error``."""
        now = self._clock()
        was = self._failing.get(key)
        if was is not None and was.error == error:
            was.count += 1
            self._log.debug("%s: %s refused again (%d times): %s", self.strategy, key, was.count,
                            error)  # fmt: skip
            return
        if was is not None:
            self._log.warning(
                "%s: %s refused, now: %s (before, %d times: %s)",
                self.strategy,
                key,
                error,
                was.count,
                was.error,
            )
        else:
            self._log.warning("%s: %s refused: %s", self.strategy, key, error)
        self._failing.pop(key, None)
        if len(self._failing) >= MAX_FAILING:
            self._failing.pop(next(iter(self._failing)))
        self._failing[key] = _Failing(error, 1, now)

    def succeeded(self, key: str) -> None:
        """The write of ``key`` went through (or found the value in place)."""
        was = self._failing.pop(key, None)
        if was is not None:
            self._log.info(
                "%s: %s written again after %d refusals (%s)",
                self.strategy,
                key,
                was.count,
                was.error,
            )

    def settle(self, attempted: Iterable[str], refused: Mapping[str, str]) -> None:
        """A batch: ``refused`` (key → error) failed, the rest of ``attempted`` went through."""
        for key in attempted:
            error = refused.get(key)
            if error is None:
                self.succeeded(key)
            else:
                self.failed(key, error)

    def forget(self, keys: Iterable[str]) -> None:
        """Stop tracking ``keys`` (their cgroups are gone), without a log line."""
        for key in keys:
            self._failing.pop(key, None)

    def __len__(self) -> int:
        return len(self._failing)

    def describe(self) -> dict[str, dict[str, Any]]:
        """The writes failing now: ``{key: {"error", "count", "since"}}``, JSON-ready."""
        return {
            k: {"error": f.error, "count": f.count, "since": f.since}
            for k, f in self._failing.items()
        }


def write_key(knob: str, rel_dir: str) -> str:
    """The key of a write in :class:`WriteFailures`: ``<knob> <cgroup>``."""
    return f"{knob} {rel_dir.strip('/') or '/'}"
