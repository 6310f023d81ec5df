"""Running plugins over built objects."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from scheduler_plugins.evaluation import Evaluation
from scheduler_plugins.framework import Framework, Plugin
from scheduler_plugins.loading import build_snapshot
from scheduler_plugins.snapshot import Snapshot, parse_pod
from scheduler_plugins.table import build_framework
from tests.scheduler.builders import NOW


def snapshot_of(*objects: dict[str, Any]) -> Snapshot:
    return build_snapshot(list(objects), "test")


def evaluate(
    objects: list[dict[str, Any]],
    pod: dict[str, Any],
    *,
    plugins: list[Plugin] | None = None,
    args: Mapping[str, Mapping[str, Any]] | None = None,
    now: float = NOW,
) -> Evaluation:
    """Filter (every verdict) and score ``pod`` over a snapshot of ``objects``."""
    fw = Framework(plugins) if plugins is not None else build_framework(plugin_args=args)
    return fw.evaluate(snapshot_of(*objects), parse_pod(pod, "pod"), now=now, all_verdicts=True)
