"""The NodeSLO keys of ``slo-controller-config``, parsed key by key into typed strategies.

Four keys hold ``{"clusterStrategy": {...}, "nodeStrategies": [{"name", "nodeSelector", ...}]}``
(``resource-threshold-config``, ``resource-qos-config``, ``cpu-burst-config``,
``system-config``); ``host-application-config`` holds ``{"applications": [...], "nodeConfigs":
[{"name", "nodeSelector", "applications"}]}``. Validation is :mod:`apis.sloconfig`'s (field
names, types and upstream's ranges, selectors). Each cluster strategy is merged field by field
over Koordinator's defaults, and each node strategy over the cluster strategy, as upstream's
``sloconfig`` does; a node takes the first node strategy whose selector matches its labels, in
list order, independently for each key.

A key is parsed on its own (:func:`parse_key`), so the controller can keep the last good value of
a bad key while taking the good ones.

The node's annotation ``node.koordinator.sh/network-bandwidth`` (a quantity) takes precedence
over the ``totalNetworkBandwidth`` of the system strategy the node gets, as upstream's
``getSystemConfigSpec`` has it; the koordlet's network QoS reads it from the NodeSLO.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from types import MappingProxyType
from typing import Any

from apis.configuration import (
    CPU_BURST_CONFIG_KEY,
    HOST_APPLICATION_CONFIG_KEY,
    RESOURCE_QOS_CONFIG_KEY,
    RESOURCE_THRESHOLD_CONFIG_KEY,
    SYSTEM_CONFIG_KEY,
    LabelSelector,
    SelectorRequirement,
)
from apis.manager_keys import ANNOTATION_NODE_BANDWIDTH
from apis.quantity import parse_quantity
from apis.records import frozen
from apis.slo import (
    HostApplication,
    NodeSLOSpec,
    NodeSLOSpecJSON,
    SchemaError,
    parse_node_slo,
    thaw,
)
from apis.slo_strategies import (
    NodeSLOStrategies,
    parse_cpu_burst_strategy,
    parse_resource_qos_strategy,
    parse_resource_threshold_strategy,
    parse_system_strategy,
    spec_json,
)
from apis.sloconfig import parse_slo_controller_config

NODE_SLO_KEYS = (
    RESOURCE_THRESHOLD_CONFIG_KEY,
    RESOURCE_QOS_CONFIG_KEY,
    CPU_BURST_CONFIG_KEY,
    SYSTEM_CONFIG_KEY,
    HOST_APPLICATION_CONFIG_KEY,
)
"""The ConfigMap keys a NodeSLO is rendered from."""

_STRATEGY_PARSERS: Mapping[str, tuple[str, Callable[..., Any]]] = {
    RESOURCE_THRESHOLD_CONFIG_KEY: (
        "resource_used_threshold_with_be",
        parse_resource_threshold_strategy,
    ),
    RESOURCE_QOS_CONFIG_KEY: ("resource_qos_strategy", parse_resource_qos_strategy),
    CPU_BURST_CONFIG_KEY: ("cpu_burst_strategy", parse_cpu_burst_strategy),
    SYSTEM_CONFIG_KEY: ("system_strategy", parse_system_strategy),
}
"""Strategy key → (attribute of :class:`NodeSLOStrategies`, section parser)."""
_PROFILE_KEYS = frozenset({"name", "nodeSelector"})


@frozen
class NodeScopedValue:
    """One ``nodeStrategies``/``nodeConfigs`` entry, resolved."""

    name: str
    """``name`` of the entry."""
    selector: LabelSelector
    """``nodeSelector``."""
    value: Any
    """The full strategy (merged over the cluster's) or the host applications."""


@frozen
class KeyConfig:
    """One key of the ConfigMap, resolved: the cluster value and the node entries in order."""

    key: str
    """The ConfigMap key."""
    cluster: Any
    """The cluster strategy (over the defaults), or the cluster's host applications."""
    nodes: tuple[NodeScopedValue, ...] = ()
    """Node entries in list order; the first match wins."""

    def for_node(self, labels: Mapping[str, str]) -> tuple[Any, str]:
        """The value for a node with ``labels`` and the name of the entry used ("" for none)."""
        for entry in self.nodes:
            if entry.selector.matches(labels):
                return entry.value, entry.name
        return self.cluster, ""


def _selector(raw: Mapping[str, Any] | None) -> LabelSelector:
    """A LabelSelector from JSON already checked by :mod:`apis.sloconfig`."""
    raw = raw or {}
    exprs = tuple(
        SelectorRequirement(str(e["key"]), str(e["operator"]), tuple(e.get("values") or ()))
        for e in raw.get("matchExpressions") or ()
    )
    return LabelSelector(MappingProxyType(dict(raw.get("matchLabels") or {})), exprs)


def _host_apps(raw: object, source: str) -> tuple[HostApplication, ...]:
    return parse_node_slo({"hostApplications": raw or []}, source, strict=False).host_applications


def parse_key(key: str, text: object, source: str) -> KeyConfig:
    """Parse and resolve one key's JSON text. Raises :class:`apis.slo.SchemaError` naming
    ``source``, the key and the field."""
    checked = parse_slo_controller_config({key: text}, source, strict=False)
    doc = thaw(checked.raw[key])
    label = f"{source}: {key}" if source else key
    if key == HOST_APPLICATION_CONFIG_KEY:
        cluster_apps = _host_apps(doc.get("applications"), label)
        nodes = tuple(
            NodeScopedValue(
                str(item.get("name") or ""),
                _selector(item.get("nodeSelector")),
                _host_apps(item.get("applications"), label),
            )
            for item in doc.get("nodeConfigs") or ()
        )
        return KeyConfig(key, cluster_apps, nodes)
    _, parse = _STRATEGY_PARSERS[key]
    cluster = parse(doc.get("clusterStrategy") or {}, path="clusterStrategy", source=label)
    entries = []
    for i, item in enumerate(doc.get("nodeStrategies") or ()):
        fields_only = {k: v for k, v in item.items() if k not in _PROFILE_KEYS}
        value = parse(
            fields_only, base=cluster, path=f"nodeStrategies[{i}]", source=label, strict=False
        )
        entries.append(
            NodeScopedValue(str(item.get("name") or ""), _selector(item.get("nodeSelector")), value)
        )
    return KeyConfig(key, cluster, tuple(entries))


def default_key(key: str) -> KeyConfig:
    """The value of a key the ConfigMap lacks: Koordinator's defaults, no node entries."""
    if key == HOST_APPLICATION_CONFIG_KEY:
        return KeyConfig(key, ())
    attr, _ = _STRATEGY_PARSERS[key]
    return KeyConfig(key, getattr(NodeSLOStrategies(), attr))


@frozen
class RenderedSLO:
    """A node's NodeSLO spec and which node entry each key used."""

    spec: NodeSLOSpecJSON
    """The full ``spec`` (every strategy group with defaults filled in)."""
    matched: Mapping[str, str]
    """Key → name of the node entry applied ("" for the cluster's)."""
    bandwidth_error: str = ""
    """Why the node's ``network-bandwidth`` annotation was not applied (empty: it was, or the
    node has none)."""


def node_bandwidth(annotations: Mapping[str, str]) -> str | None:
    """The node's ``network-bandwidth`` annotation as a canonical quantity (``"99M"``), None
    without one (upstream ``GetNodeTotalBandwidth``). Raises :class:`~apis.slo.SchemaError` (a
    ``ValueError``) naming the annotation for a value that is not a quantity."""
    raw = annotations.get(ANNOTATION_NODE_BANDWIDTH)
    if raw is None:
        return None
    try:
        return str(parse_quantity(raw))
    except ValueError as err:
        raise SchemaError(
            str(err), source=f"annotation {ANNOTATION_NODE_BANDWIDTH}={raw!r}"
        ) from None


def render(
    keys: Mapping[str, KeyConfig],
    labels: Mapping[str, str],
    annotations: Mapping[str, str] | None = None,
) -> RenderedSLO:
    """The NodeSLO spec of a node with ``labels`` and ``annotations`` under the resolved
    ``keys`` (a missing key counts as its defaults). A ``network-bandwidth`` annotation that is
    not a quantity is left out (the configured bandwidth stays) and reported in
    :attr:`RenderedSLO.bandwidth_error`."""
    values: dict[str, Any] = {}
    matched: dict[str, str] = {}
    for key in NODE_SLO_KEYS:
        cfg = keys.get(key) or default_key(key)
        values[key], matched[key] = cfg.for_node(labels)
    bandwidth_error = ""
    try:
        bandwidth = node_bandwidth(annotations or {})
    except ValueError as err:
        bandwidth, bandwidth_error = None, str(err)
    if bandwidth is not None:
        values[SYSTEM_CONFIG_KEY] = replace(
            values[SYSTEM_CONFIG_KEY], total_network_bandwidth=bandwidth
        )
    strategies = NodeSLOStrategies(
        **{_STRATEGY_PARSERS[k][0]: values[k] for k in _STRATEGY_PARSERS},
    )
    apps: tuple[HostApplication, ...] = values[HOST_APPLICATION_CONFIG_KEY]
    spec = spec_json(strategies, NodeSLOSpec(host_applications=apps))
    return RenderedSLO(spec, MappingProxyType(matched), bandwidth_error)
