"""The runtime hooks' ``koordlet_*`` metric families.

- ``koordlet_runtime_hook_invoked_duration_milliseconds{node,hook,stage,status}``: upstream's
  family (``pkg/koordlet/metrics/runtime_hook.go``: buckets 0.01 ms x4 up to 163.84 ms, status
  ``succeeded`` or ``failed``), one sample per hook call at a hook point (upstream's ``RunHooks``
  in ``hooks/hooks.go``; the reconciler's rounds are not observed, as upstream's);
- ``koordlet_runtime_hook_fail_open_total{mode,stage,reason}``, ours: requests that went on
  unchanged because the framework failed (``error``, ``timeout``, ``write_error``);
- ``koordlet_runtime_hook_bad_input_total{hook,stage,reason}``, ours: pods left unchanged because
  their own data was malformed (each also gets a Warning Event);
- ``koordlet_runtime_hook_requests_total{mode,stage}``, ours: requests handled per mode.
"""

from __future__ import annotations

from koordlet.prom import CollectorRegistry, Counter, Histogram
from koordlet.prom.instruments import HistogramChild

STATUS_SUCCEEDED = "succeeded"
"""Upstream's ``StatusSucceed`` label value."""
STATUS_FAILED = "failed"
"""Upstream's ``StatusFailed`` label value."""
BUCKETS_MS = tuple(0.01 * 4**i for i in range(8))
"""Upstream's ``prometheus.ExponentialBuckets(0.01, 4, 8)``: 10 µs to 164 ms."""


class HookMetrics:
    """The families above, registered in ``registry``; ``node`` is this node's name."""

    def __init__(self, registry: CollectorRegistry | None, *, node: str = "") -> None:
        self.node = node
        self.invoked = Histogram(
            "koordlet_runtime_hook_invoked_duration_milliseconds",
            "time duration of invocations of runtime hook plugins",
            ("node", "hook", "stage", "status"),
            buckets=BUCKETS_MS,
            registry=registry,
        )
        self.fail_open = Counter(
            "koordlet_runtime_hook_fail_open",
            "Requests that went on unchanged because a runtime hook failed or timed out.",
            ("mode", "stage", "reason"),
            registry=registry,
        )
        self.bad_input = Counter(
            "koordlet_runtime_hook_bad_input",
            "Pods left unchanged because their own data (extended resources) was malformed.",
            ("hook", "stage", "reason"),
            registry=registry,
        )
        self.requests = Counter(
            "koordlet_runtime_hook_requests",
            "Requests the runtime hooks handled, per mode (proxy, nri) and stage.",
            ("mode", "stage"),
            registry=registry,
        )

        self._invoked: dict[tuple[str, str, bool], HistogramChild] = {}
        """The histogram's child per (hook, stage, failed): ``labels()`` costs several times an
        ``observe``."""

    def observe(self, hook: str, stage: str, seconds: float, *, failed: bool) -> None:
        """One hook call took ``seconds``."""
        child = self._invoked.get((hook, stage, failed))
        if child is None:
            status = STATUS_FAILED if failed else STATUS_SUCCEEDED
            child = self._invoked[hook, stage, failed] = self.invoked.labels(
                self.node, hook, stage, status
            )
        child.observe(max(seconds, 0.0) * 1000.0)
