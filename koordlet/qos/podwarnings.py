"""Malformed pod annotations, said once: a Warning Event, a metric and ``/debug/qos``.

A strategy that finds a pod-level override it cannot apply (``koordinator.sh/cpuQOS``,
``node.koordinator.sh/resctrl``, ``koordinator.sh/networkQOS``, ``koordinator.sh/oom-score-adj``;
:mod:`apis.pod_overrides`) keeps the pod on its class defaults and calls
:meth:`PodAnnotationWarnings.report`. The first time a pod carries a given malformed value, and
only then (not at every round), that records:

- a Warning Event ``InvalidPodAnnotation`` on the pod naming the annotation and the error
  (cluster mode: through the API server, in an owned task; standalone: a log line);
- one more in ``koordlet_pod_annotation_rejected_total{annotation}``;
- an entry in :meth:`PodAnnotationWarnings.describe` (``/debug/qos``, ``pod_annotations``) while
  the pod keeps that value.

A corrected value clears the entry; a new malformed value is reported again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Iterator
from typing import TYPE_CHECKING, Any, Protocol

from apis.pod_overrides import INVALID_ANNOTATION_REASON
from koordlet.prom import CounterMetricFamily
from kubeclient.events import PodEventSink

if TYPE_CHECKING:
    from koordlet.prom import Metric
    from koordlet.statesinformer.model import PodInfo
    from kubeclient.client import KubeClient

logger = logging.getLogger(__name__)

EVENT_REASON = INVALID_ANNOTATION_REASON
"""The Warning Event's ``reason``."""
COMPONENT = "koordlet"
"""The Event's ``source.component``."""


class PodWarningSink(Protocol):
    """Where a pod's Warning Event goes; must not block."""

    def warn(self, pod: PodInfo, reason: str, message: str) -> None: ...


class LogSink:
    """Standalone: the warning is a log line."""

    def warn(self, pod: PodInfo, reason: str, message: str) -> None:
        logger.warning("pod %s/%s: %s: %s", pod.namespace, pod.name, reason, message)


class KubeEventSink(PodEventSink):
    """Cluster mode: a core/v1 Warning Event on the pod (the shared
    :class:`~kubeclient.events.PodEventSink`), created in an owned task."""

    def __init__(self, client: KubeClient, node_name: str) -> None:
        super().__init__(
            client, node_name, component=COMPONENT, task_prefix="qos/pod-warning-", log=logger
        )


class PodAnnotationWarnings:
    """See the module docstring. A Prometheus collector (``koordlet_pod_annotation_rejected_
    total``) the daemon registers."""

    def __init__(
        self, sink: PodWarningSink | None = None, *, clock: Callable[[], float] = time.time
    ) -> None:
        self.sink: PodWarningSink = sink or LogSink()
        self._clock = clock
        self._current: dict[tuple[str, str], dict[str, Any]] = {}
        """(pod uid, annotation) → the malformed value, the error, who saw it, when."""
        self.rejected: dict[str, int] = {}
        """Annotation → distinct malformed values seen (pods x values)."""

    def report(self, strategy: str, pod: PodInfo, annotation: str, error: str) -> None:
        """``pod``'s ``annotation`` cannot be applied (``error`` says why); it keeps its class
        defaults. Recorded once per pod and value."""
        value = pod.annotations.get(annotation, "")
        key = (pod.uid, annotation)
        seen = self._current.get(key)
        if seen is not None and seen["value"] == value:
            return
        self._current[key] = {
            "pod": f"{pod.namespace}/{pod.name}",
            "annotation": annotation,
            "value": value[:256],
            "error": error,
            "strategy": strategy,
            "since": self._clock(),
        }
        self.rejected[annotation] = self.rejected.get(annotation, 0) + 1
        message = f"annotation {annotation} ignored, the pod keeps its QoS class defaults: {error}"
        try:
            self.sink.warn(pod, EVENT_REASON, message)
        except Exception:  # the sink's failure must not stop the strategy's round
            logger.exception("recording a warning on pod %s/%s failed", pod.namespace, pod.name)

    def valid(self, pod: PodInfo, annotation: str) -> None:
        """``pod``'s ``annotation`` is absent or fine now: forget an earlier rejection."""
        self._current.pop((pod.uid, annotation), None)

    def prune(self, live: Collection[str]) -> None:
        """Forget the pods whose UIDs are not in ``live``."""
        for key in [k for k in self._current if k[0] not in live]:
            del self._current[key]

    def describe(self) -> list[dict[str, Any]]:
        """The malformed annotations pods carry now, plain data for ``/debug/qos``."""
        return [dict(v) for _, v in sorted(self._current.items())]

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(
            "koordlet_pod_annotation_rejected",
            "Pod annotations a QoS strategy could not apply (the pod kept its class defaults), "
            "counted once per pod and malformed value",
            labels=["annotation"],
        )
        for annotation, count in sorted(self.rejected.items()):
            family.add_metric([annotation], count)
        yield family
