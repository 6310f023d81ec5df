"""What the QoS strategy tests build a ``StrategyContext`` from: a NodeSLO in force from raw
sections, and a real configuration."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from apis.slo_inforce import NodeSLOInForce, node_slo_in_force
from koordlet.config import KoordletConfig
from koordlet.features import FeatureGates


class GateSwitch(Protocol):
    def enabled(self, name: str) -> bool: ...


def in_force(spec: dict[str, Any] | None = None, **sections: Any) -> NodeSLOInForce:
    """The NodeSLO in force for a raw spec (camelCase sections, as in a NodeSLO), read as the
    API server source reads it: a bad section is rejected and the defaults stay."""
    doc = {**(spec or {}), **{k: v for k, v in sections.items() if v is not None}}
    return node_slo_in_force(doc, source="test", strict=False, now=0.0)


def config(gates: GateSwitch | None = None, *, node_name: str = "n") -> KoordletConfig:
    """A configuration with every default (1 s intervals), and ``gates`` as the feature gates
    (a stub with ``enabled(name)`` for the strategies' optional upstream sub-gates)."""
    return KoordletConfig(
        node_name=node_name,
        feature_gates=gates or FeatureGates(),  # type: ignore[arg-type]  # a stub is enough
    )


def following(raw: Callable[[], dict[str, Any]]) -> Callable[[], NodeSLOInForce]:
    """A NodeSLO source for a test: ``raw()`` (a spec) read at each call over the value in force,
    as the states informer reads each change (a rejected section keeps its last good value)."""
    state = [NodeSLOInForce()]

    def current() -> NodeSLOInForce:
        state[0] = node_slo_in_force(raw(), source="test", strict=False, now=0.0, previous=state[0])
        return state[0]

    return current
