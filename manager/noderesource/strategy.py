"""The colocation strategy in force on one node.

Order, as Koordinator resolves it (``GetNodeColocationStrategy`` upstream): Koordinator's
defaults, under the ConfigMap's cluster strategy, under the first ``nodeConfigs`` entry whose
selector matches the node's labels, under the ``node.koordinator.sh/colocation-strategy``
annotation (JSON; ignored when unreadable), under the ``node.koordinator.sh/cpu-reclaim-ratio``
and ``memory-reclaim-ratio`` labels (a ratio, times 100; ignored when not a number ≥ 0).
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from typing import Any

from apis.configuration import ColocationConfig, ColocationStrategy
from apis.manager_keys import (
    ANNOTATION_NODE_COLOCATION_STRATEGY,
    LABEL_CPU_RECLAIM_RATIO,
    LABEL_MEMORY_RECLAIM_RATIO,
)
from apis.records import frozen
from apis.slo import SchemaError
from apis.sloconfig import parse_colocation_overrides
from manager.noderesource.inputs import NodeView


@frozen
class NodeStrategy:
    """The strategy of a node and where its parts came from."""

    strategy: ColocationStrategy
    """The resolved strategy."""
    enabled: bool
    """Colocation on: the cluster strategy and the node's both say ``enable: true``."""
    node_config: str
    """Name of the ``nodeConfigs`` entry applied (empty: none, or an unnamed one)."""
    matched: bool
    """Whether a ``nodeConfigs`` entry applied."""
    notes: tuple[str, ...]
    """Overrides applied or ignored, for explain."""


def _reclaim_percent(raw: str | None) -> int | None:
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        return None
    if not math.isfinite(value) or value < 0:
        return None
    return int(value * 100)


def resolve(config: ColocationConfig, node: NodeView) -> NodeStrategy:
    """The strategy in force on ``node``."""
    notes: list[str] = []
    matched_name = ""
    matched = False
    strategy = config.cluster
    for cfg in config.node_configs:
        if cfg.selector.matches(node.labels):
            strategy = replace(strategy, **cfg.overrides)
            matched_name, matched = cfg.name, True
            notes.append(f"nodeConfigs entry {cfg.name!r} applies: {sorted(cfg.overrides)}")
            break
    raw = node.annotations.get(ANNOTATION_NODE_COLOCATION_STRATEGY)
    if raw is not None:
        try:
            doc = json.loads(raw)
            overrides = parse_colocation_overrides(doc, ANNOTATION_NODE_COLOCATION_STRATEGY)
        except (ValueError, SchemaError) as err:
            notes.append(f"annotation {ANNOTATION_NODE_COLOCATION_STRATEGY} ignored: {err}")
        else:
            strategy = replace(strategy, **overrides)
            notes.append(f"annotation {ANNOTATION_NODE_COLOCATION_STRATEGY}: {sorted(overrides)}")
    for label, attr in (
        (LABEL_CPU_RECLAIM_RATIO, "cpu_reclaim_threshold_percent"),
        (LABEL_MEMORY_RECLAIM_RATIO, "memory_reclaim_threshold_percent"),
    ):
        raw_label = node.labels.get(label)
        percent = _reclaim_percent(raw_label)
        if percent is not None:
            label_override: dict[str, Any] = {attr: percent}
            strategy = replace(strategy, **label_override)
            notes.append(f"label {label}={raw_label}: {attr} = {percent}")
        elif raw_label is not None:
            notes.append(f"label {label}={raw_label!r} ignored: not a number >= 0")
    enabled = config.cluster.enable and strategy.enable
    return NodeStrategy(strategy, enabled, matched_name, matched, tuple(notes))
